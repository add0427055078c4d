"""One node's name, as Slurm and the agents name nodes: never a host list.

Slurm reads ``gpu[001-512]`` or ``a,b`` as many nodes, so a name with brackets or commas, taken
from an agent's heartbeat or point or from a person's request, would aim a drain at every node
it expands to. Such names are refused wherever a node is named.
"""

from __future__ import annotations

HOSTLIST_CHARACTERS = frozenset("[],")


def is_single_node_name(name: object) -> bool:
    """True for one node's name; False for a Slurm host list (``gpu[001-512]``, ``a,b``), a
    blank name or one with spaces."""
    return (
        isinstance(name, str)
        and bool(name)
        and HOSTLIST_CHARACTERS.isdisjoint(name)
        and not any(character.isspace() for character in name)
    )
