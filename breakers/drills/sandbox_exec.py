"""The sandbox's own parent: starts a drill's command and holds none of the console's secrets.

Run by the drill runner as ``python -I sandbox_exec.py [--user NAME] [--pid-fd N] -- COMMAND...``
with the sandbox's allowlisted environment only (never the console's), so the command's parent
process has nothing to show in /proc/$PPID/environ. The command leads a session of its own (what
the drill stops as a whole); its pid is written to file descriptor N for the runner. Before it
starts the command it:

1. switches to ``--user`` (the operator's ``BRAKELINE_DRILL_SANDBOX_USER``) when started as
   root: a team's command never runs as the console's user;
2. sets ``no_new_privs`` and empties the capability bounding set, so even a command left at uid
   0 has no ``CAP_SYS_PTRACE``: the console's processes are not dumpable
   (``core.hardening``), and without that capability nobody reads their environment or memory.

Then it waits for the command, passes on the signals it receives (a drill's stop, an executor's
SIGTERM) and exits with the command's status. Standard library only: it runs before, and
outside, anything of the console.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import signal
import subprocess
import sys

PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
LAST_CAPABILITY = 63  # higher than any kernel's: an unknown one is EINVAL, ignored


def _switch_user(name: str) -> None:
    if not name or os.geteuid() != 0:
        return
    entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    os.setgroups([])
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)


def _drop_privileges() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for capability in range(LAST_CAPABILITY + 1):
        libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0)


PR_SET_PDEATHSIG = 1
UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)


def _die_with_parent() -> None:
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def main(argv: list[str]) -> int:
    user, pid_fd = "", -1
    while argv[:1] in (["--user"], ["--pid-fd"]):
        if argv[0] == "--user":
            user = argv[1]
        else:
            pid_fd = int(argv[1])
        argv = argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("sandbox_exec: no command", file=sys.stderr)
        return 2
    _switch_user(user)
    _drop_privileges()
    # The command dies with this process (a runner that kills it leaves no orphan behind).
    child = subprocess.Popen(
        argv, close_fds=True, start_new_session=True, preexec_fn=_die_with_parent
    )
    if pid_fd >= 0:
        os.write(pid_fd, f"{child.pid}\n".encode())
        os.close(pid_fd)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP):
        signal.signal(signum, lambda received, _frame: child.send_signal(received))
    code = child.wait()
    if code < 0:  # killed by a signal: die of the same one, so the runner sees it as before
        if -code not in UNCATCHABLE:  # their action is the default already, and cannot be set
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
