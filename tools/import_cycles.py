"""An import-linter contract: no module of the listed packages imports itself back.

import-linter's own ``acyclic_siblings`` contract judges whole packages (``breakers.control``
against ``breakers.executors``); this one judges modules, as Python imports them, and counts
every import, also one inside a function or under ``if TYPE_CHECKING:`` (import-linter's
graph holds those unless ``exclude_type_checking_imports`` is set, which this project does
not). A cycle is a strongly connected group of modules; the contract names each group with the
imports that close it.

Each package must be one of the root packages, wherever it is found on the path (the SDK is
a distribution of its own, ``sdk/brakeline``): of any other, the graph holds only the name.
"""

from __future__ import annotations

from collections.abc import Iterable

from grimp import ImportGraph
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of two or more modules that import each other, directly or not (Tarjan's
    algorithm, iterative: the import graph is deep enough to exhaust Python's recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    group = _pop_group(stack, on_stack, node)
                    if len(group) > 1:
                        groups.append(sorted(group))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(groups)


def _pop_group(stack: list[str], on_stack: set[str], node: str) -> list[str]:
    group = []
    while True:
        member = stack.pop()
        on_stack.discard(member)
        group.append(member)
        if member == node:
            return group


class AcyclicModulesContract(Contract):
    type_name = "acyclic_modules"

    packages = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        modules = _modules_of(graph, self.packages)  # type: ignore[arg-type]
        edges = {
            module: graph.find_modules_directly_imported_by(module) & modules for module in modules
        }
        cycles = []
        for group in strongly_connected(edges):
            members = set(group)
            imports = [
                f"{importer} -> {imported} (l. {detail['line_number']})"
                for importer in group
                for imported in sorted(edges[importer] & members)
                for detail in graph.get_import_details(importer=importer, imported=imported)
            ]
            cycles.append({"modules": group, "imports": imports})
        return ContractCheck(kept=not cycles, warnings=None, metadata={"cycles": cycles})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for cycle in check.metadata["cycles"]:
            output.print_error(f"These modules import each other: {', '.join(cycle['modules'])}")
            for line in cycle["imports"]:
                output.print_error(f"- {line}")
            output.new_line()


def _modules_of(graph: ImportGraph, packages: Iterable[str]) -> set[str]:
    found = set()
    for package in packages:
        if package not in graph.modules or graph.is_module_squashed(package):
            raise ValueError(
                f"acyclic_modules: {package!r} is not one of the root packages; add it to "
                "root_packages so that its modules are in the graph"
            )
        found |= {package} | graph.find_descendants(package)
    return found
