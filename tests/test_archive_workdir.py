"""Extracted archives' working directories do not outlive their process: a killed server's (or Ray replica's) is
removed by the next one that starts on the host, a live one's is kept, forked children keep their parent's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import RunningServer
from http_client import call
from models import sleep_archive
from servetune.archive.workdir import LOCK_NAME, owned_workdir, remove_workdir

# a process that makes a working directory under argv[1], prints it, (forks a child that sleeps, with "fork"), and
# sleeps until killed
_OWNER = r"""
import os, sys, time
from servetune.archive.workdir import owned_workdir
path = owned_workdir("st-test-", sys.argv[1])
if sys.argv[2] == "fork" and os.fork() == 0:
    os.write(1, b"%d\n" % os.getpid())  # one write each, whole lines: the two processes share the pipe
    time.sleep(600)
    os._exit(0)
os.write(1, b"%s\n" % os.fsencode(path))
if sys.argv[2] == "fork":
    os._exit(0)  # the maker ends at once; its forked child holds the lock on
time.sleep(600)
"""


def _owner(root: Path, mode: str = "") -> tuple[subprocess.Popen[str], list[str]]:
    """Start an owner; its lines (with ``fork``: the child's pid and the directory, in either order), read and the
    pipe closed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _OWNER, str(root), mode or "plain"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    with proc.stdout:
        lines = sorted(proc.stdout.readline().strip() for _ in range(2 if mode == "fork" else 1))
    return proc, lines  # sorted: a path ("/...") before a pid (digits)


def test_a_killed_owners_directory_is_removed_by_the_next_and_a_live_ones_is_kept(tmp_path: Path) -> None:
    killed, [killed_dir] = _owner(tmp_path)
    alive, [alive_dir] = _owner(tmp_path)
    foreign = tmp_path / "st-test-foreign"  # same prefix, no lock file: not this module's, left alone
    foreign.mkdir()
    (Path(killed_dir) / "model.pt").write_bytes(b"x" * 1000)
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
        assert Path(killed_dir).is_dir()  # nothing removes it until another directory is made
        mine = owned_workdir("st-test-", str(tmp_path))
        assert not Path(killed_dir).exists()
        assert Path(alive_dir).is_dir() and (Path(alive_dir) / LOCK_NAME).is_file()
        assert foreign.is_dir()
        again = owned_workdir("st-test-", str(tmp_path))  # this process's own first directory is live too
        assert mine.is_dir() and again.is_dir()
        remove_workdir(mine)
        remove_workdir(again)
        assert not mine.exists() and not again.exists()
    finally:
        alive.kill()
        alive.wait(10)
    owned_workdir("st-test-", str(tmp_path))
    assert not Path(alive_dir).exists()  # its owner has gone since


def test_a_forked_child_keeps_the_directory_after_its_maker_has_gone(tmp_path: Path) -> None:
    maker, [made, child_pid] = _owner(tmp_path, "fork")
    maker.wait(10)
    try:
        mine = owned_workdir("st-test-", str(tmp_path))
        assert Path(made).is_dir()  # the child still holds the lock its maker took
    finally:
        os.kill(int(child_pid), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(made).exists() and time.monotonic() < deadline:
        remove_workdir(owned_workdir("st-test-", str(tmp_path)))
        time.sleep(0.05)
    assert not Path(made).exists() and mine.is_dir()


def test_a_server_killed_with_sigkill_leaves_no_extracted_archive_behind_its_successor(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    sleep_archive(store, batch_ms=1.0)
    tmp = tmp_path / "tmp"
    tmp.mkdir()

    def start(n: int) -> RunningServer:
        props = {"disable_token_authorization": "true", "default_workers_per_model": "1"}
        server = RunningServer(store, {"sleep": "sleep.mar"}, props, workdir=tmp_path / f"s{n}", startup_timeout=120)
        server.env["TMPDIR"] = str(tmp)
        server.start()
        return server

    first = start(0)
    reply = call("POST", f"{first.inference_url}/predictions/sleep", b"a")
    assert reply.status == 200, reply.body
    [made] = [p for p in tmp.iterdir() if p.name.startswith("servetune-models-")]
    assert any(made.rglob("MANIFEST.json")), sorted(str(p) for p in made.rglob("*"))
    first.stop(signal.SIGKILL)
    assert made.is_dir()  # killed: it could not remove its own
    second = start(1)
    try:
        assert json.loads(call("GET", f"{second.inference_url}/ping").body)["status"] == "Healthy"
        assert not made.exists()
        assert len([p for p in tmp.iterdir() if p.name.startswith("servetune-models-")]) == 1  # the live one's
    finally:
        second.stop()
    assert not [p for p in tmp.iterdir() if p.name.startswith("servetune-models-")]  # stopped: removed its own
