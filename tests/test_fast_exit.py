"""The console entry ends without the interpreter's teardown (nondet/cli/fast_exit.py).

Each ending runs in its own interpreter: exit handlers ran, a thread that is not a daemon was waited for,
a megabyte on stdout arrived whole, the code is the command's. Positive control: an object freed at the
interpreter's teardown leaves its mark with NONDET_FAST_EXIT=0 and none with the fast ending.
"""

import subprocess
import sys

import pytest

from nondet.cli import app, fast_exit

_ENDING = """
import atexit, sys, threading, time
from nondet.cli import fast_exit

folder = sys.argv[1]
def mark(name):
    open(f"{folder}/{name}", "w").write(name)

class FreedAtTeardown:
    def __del__(self, _open=open, _folder=folder):  # builtins are gone by then: bound here
        _open(f"{_folder}/freed", "w").write("freed")

kept = FreedAtTeardown()
atexit.register(mark, "exit-handler")
threading.Thread(target=lambda: (time.sleep(0.5), mark("thread"))).start()
sys.stdout.write("x" * 1_000_000)
fast_exit.end(7)
"""


@pytest.mark.parametrize("setting", ["1", "0"])
def test_the_ending_runs_handlers_waits_for_threads_flushes_and_skips_only_the_freeing(tmp_path, setting):
    env = {"PATH": "/usr/bin:/bin", fast_exit.ENV: setting}
    r = subprocess.run([sys.executable, "-c", _ENDING, str(tmp_path)], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 7 and len(r.stdout) == 1_000_000, r.stderr
    assert (tmp_path / "exit-handler").exists() and (tmp_path / "thread").exists()
    assert (tmp_path / "freed").exists() == (setting == "0")  # the teardown: skipped by the fast ending only


class _Ended(Exception):
    """What the stand-in for fast_exit.end raises: like the real one, it does not return."""


def _end(code):
    raise _Ended(code)


@pytest.mark.parametrize("command, code", [(lambda: None, 0), (lambda: sys.exit(3), 3), (lambda: sys.exit(None), 0)])
def test_the_console_entry_ends_with_the_commands_code(monkeypatch, command, code):
    monkeypatch.setattr(fast_exit, "end", _end)
    monkeypatch.setattr(app, "main", command)
    with pytest.raises(_Ended) as ended:
        app.run()
    assert ended.value.args == (code,)


def test_a_system_exit_with_a_message_ends_the_usual_way(monkeypatch):
    monkeypatch.setattr(fast_exit, "end", lambda code: pytest.fail("ended fast"))
    monkeypatch.setattr(app, "main", lambda: sys.exit("a message"))
    with pytest.raises(SystemExit, match="a message"):
        app.run()
