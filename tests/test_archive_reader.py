from __future__ import annotations

import io
import json
import os
import stat
import struct
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from servetune._exceptions import ArchiveError
from servetune.archive import Manifest, ModelArchive, open_archive

MANIFEST = {
    "createdOn": "01/02/2025 10:11:12",
    "runtime": "python",
    "model": {"modelName": "echo", "handler": "echo.py", "modelVersion": "1.0", "configFile": "model-config.yaml"},
    "archiverVersion": "0.12.0",
    "custom": {"kept": True},
}
FILES = {
    "echo.py": b"def handle(data, context):\n    return data\n",
    "weights.bin": bytes(range(256)) * 8,
    "model-config.yaml": b"batchSize: 4\nmaxBatchDelay: 50\nhandler:\n  threshold: 0.5\n",
    "assets/vocab.txt": b"a\nb\n",
}


def make_zip(path: Path, entries: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return path


def make_tar_gz(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def tar_file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def archive_entries() -> dict[str, bytes]:
    return {**FILES, "MAR-INF/MANIFEST.json": json.dumps(MANIFEST, indent=2).encode()}


def tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def check_loaded(archive: ModelArchive) -> None:
    assert archive.manifest == Manifest.from_dict(MANIFEST)
    assert archive.manifest.raw == MANIFEST
    assert archive.model_config == {"batchSize": 4, "maxBatchDelay": 50, "handler": {"threshold": 0.5}}
    for name, data in FILES.items():
        assert (archive.model_dir / name).read_bytes() == data


@pytest.mark.parametrize("compression", [zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED])
def test_zip_mar(tmp_path: Path, compression: int) -> None:
    mar = make_zip(tmp_path / "echo.mar", archive_entries(), compression)
    archive = open_archive(mar, tmp_path / "out")
    check_loaded(archive)
    assert archive.source == mar and archive.model_dir == (tmp_path / "out").resolve() and archive.extracted


def test_format_is_recognised_by_content_not_name(tmp_path: Path) -> None:
    zipped = make_zip(tmp_path / "model.tar.gz", archive_entries())
    check_loaded(open_archive(zipped, tmp_path / "a"))
    tgz = make_tar_gz(tmp_path / "model.mar", [tar_file(f"echo/{k}", v) for k, v in archive_entries().items()])
    check_loaded(open_archive(tgz, tmp_path / "b"))
    (tmp_path / "junk.mar").write_bytes(b"not an archive")
    with pytest.raises(ArchiveError, match="junk.mar: not a model archive"):
        open_archive(tmp_path / "junk.mar", tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_tar_gz_drops_the_top_level_folder_like_torchserve(tmp_path: Path) -> None:
    members = [tar_file(f"echo/{k}", v) for k, v in archive_entries().items()]
    members.insert(0, (tarfile.TarInfo("echo"), None))
    members[0][0].type = tarfile.DIRTYPE
    check_loaded(open_archive(make_tar_gz(tmp_path / "echo.tar.gz", members), tmp_path / "out"))
    # `tar czf m.tgz -C dir .` writes "./name": TorchServe drops the "./" the same way.
    dotted = make_tar_gz(tmp_path / "dot.tgz", [tar_file(f"./{k}", v) for k, v in archive_entries().items()])
    check_loaded(open_archive(dotted, tmp_path / "dot"))
    assert tree(tmp_path / "dot") == tree(tmp_path / "out")


def test_directory_is_used_in_place(tmp_path: Path) -> None:
    model = tmp_path / "echo"
    for name, data in archive_entries().items():
        (model / name).parent.mkdir(parents=True, exist_ok=True)
        (model / name).write_bytes(data)
    archive = open_archive(model, tmp_path / "unused")
    check_loaded(archive)
    assert archive.model_dir == model.resolve() and not archive.extracted
    assert not (tmp_path / "unused").exists()
    # A store folder holding just the unpacked tarball's top folder stands for that folder, as in TorchServe.
    wrapper = tmp_path / "wrapper"
    wrapper.mkdir()
    model.rename(wrapper / "echo")
    assert open_archive(wrapper, tmp_path / "unused").model_dir == (wrapper / "echo").resolve()


def test_directory_without_manifest_gets_the_empty_manifest(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "handler.py").write_text("")
    archive = open_archive(tmp_path / "m", tmp_path / "x")
    assert archive.manifest == Manifest() and archive.manifest.raw == {} and archive.model_config == {}
    # Only MAR-INF inside: that is the manifest folder, not a wrapped model.
    (tmp_path / "n" / "MAR-INF").mkdir(parents=True)
    (tmp_path / "n" / "MAR-INF" / "MANIFEST.json").write_text('{"model": {"modelName": "n"}}')
    assert open_archive(tmp_path / "n", tmp_path / "x").manifest.model.model_name == "n"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (b"- a\n- b\n", "expected a mapping"),
        (b"a: [1, 2\n", "invalid YAML"),
        (b"!!python/object/apply:os.system ['true']\n", "invalid YAML"),
    ],
)
def test_bad_model_config_is_an_archive_error(tmp_path: Path, config: bytes, message: str) -> None:
    mar = make_zip(tmp_path / "m.mar", {**archive_entries(), "model-config.yaml": config})
    with pytest.raises(ArchiveError, match=message):
        open_archive(mar, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_empty_model_config_and_missing_config_file(tmp_path: Path) -> None:
    mar = make_zip(tmp_path / "m.mar", {**archive_entries(), "model-config.yaml": b""})
    assert open_archive(mar, tmp_path / "a").model_config == {}
    entries = archive_entries()
    del entries["model-config.yaml"]
    with pytest.raises(ArchiveError, match="configFile 'model-config.yaml'"):
        open_archive(make_zip(tmp_path / "n.mar", entries), tmp_path / "b")


def test_config_file_naming_a_path_outside_is_refused(tmp_path: Path) -> None:
    manifest = {"model": {"modelName": "m", "configFile": "../../secret.yaml"}}
    mar = make_zip(tmp_path / "m.mar", {"MAR-INF/MANIFEST.json": json.dumps(manifest).encode()})
    (tmp_path / "secret.yaml").write_text("a: 1\n")
    with pytest.raises(ArchiveError, match="'..' component"):
        open_archive(mar, tmp_path / "out")


def test_invalid_manifest_names_the_archive(tmp_path: Path) -> None:
    mar = make_zip(tmp_path / "m.mar", {"MAR-INF/MANIFEST.json": b"{oops"})
    with pytest.raises(ArchiveError, match=r"m\.mar: MAR-INF/MANIFEST\.json: not valid JSON"):
        open_archive(mar, tmp_path / "out")


def test_dest_must_be_new_or_empty_and_is_left_as_found(tmp_path: Path) -> None:
    mar = make_zip(tmp_path / "m.mar", archive_entries())
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_text("x")
    with pytest.raises(ArchiveError, match="not empty"):
        open_archive(mar, tmp_path / "full")
    assert tree(tmp_path / "full") == {"keep"}
    (tmp_path / "empty").mkdir()
    bad = make_zip(tmp_path / "bad.mar", {**archive_entries(), "../evil": b"x"})
    with pytest.raises(ArchiveError):
        open_archive(bad, tmp_path / "empty")
    assert (tmp_path / "empty").is_dir() and tree(tmp_path / "empty") == set()
    with pytest.raises(ArchiveError, match="no such model archive"):
        open_archive(tmp_path / "missing.mar", tmp_path / "x")


# ---- safety: every refusal raises ArchiveError, names archive and entry, and writes nothing outside dest


def snapshot(root: Path) -> set[str]:
    return {os.path.relpath(os.path.join(d, n), root) for d, dirs, files in os.walk(root) for n in dirs + files}


def assert_refused(archive: Path, dest: Path, *fragments: str, limit: int = 8 << 30) -> None:
    before = snapshot(dest.parent)
    with pytest.raises(ArchiveError) as info:
        open_archive(archive, dest, max_uncompressed_bytes=limit)
    message = str(info.value)
    assert str(archive) in message
    for fragment in fragments:
        assert fragment in message
    assert snapshot(dest.parent) == before  # dest removed again; nothing anywhere else


def zip_symlink(path: Path, name: str, target: str) -> Path:
    info = zipfile.ZipInfo(name)
    info.create_system = 3
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("ok.txt", b"ok")
        zf.writestr(info, target)
        zf.writestr(f"{name}/passwd", b"pwned")
    return path


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("../evil", "'..' component"),
        ("a/../../evil", "'..' component"),
        ("ok/../evil", "'..' component"),
        ("..\\evil", "backslash"),
        ("C:/evil", "drive letter"),
    ],
)
def test_zip_slip_is_refused(tmp_path: Path, name: str, why: str) -> None:
    mar = make_zip(tmp_path / "evil.mar", {"ok.txt": b"ok", name: b"pwned"})
    assert_refused(mar, tmp_path / "dest", repr(name), why)
    assert not (tmp_path / "evil").exists()


def test_absolute_zip_entry_is_refused(tmp_path: Path) -> None:
    target = f"{tmp_path}/abs_evil"
    mar = make_zip(tmp_path / "evil.mar", {"ok.txt": b"ok", target: b"pwned"})
    assert_refused(mar, tmp_path / "dest", repr(target), "absolute path")
    assert not Path(target).exists()


def test_zip_symlink_entry_is_refused(tmp_path: Path) -> None:
    (tmp_path / "outside").mkdir()
    mar = zip_symlink(tmp_path / "link.mar", "link", str(tmp_path / "outside"))
    assert_refused(mar, tmp_path / "dest", "'link'", "symbolic link")
    assert list((tmp_path / "outside").iterdir()) == []


def test_zip_special_file_and_encrypted_entries_are_refused(tmp_path: Path) -> None:
    info = zipfile.ZipInfo("fifo")
    info.external_attr = (stat.S_IFIFO | 0o644) << 16
    with zipfile.ZipFile(tmp_path / "fifo.mar", "w") as zf:
        zf.writestr(info, b"")
    assert_refused(tmp_path / "fifo.mar", tmp_path / "dest", "'fifo'", "special file")
    data = bytearray(make_zip(tmp_path / "enc.mar", {"secret.bin": b"x" * 100}).read_bytes())
    struct.pack_into("<H", data, 6, 1)  # general purpose flag bit 0: encrypted
    struct.pack_into("<H", data, data.rfind(b"PK\x01\x02") + 8, 1)
    (tmp_path / "enc.mar").write_bytes(bytes(data))
    assert_refused(tmp_path / "enc.mar", tmp_path / "dest", "'secret.bin'", "encrypted")


def test_zip_over_the_declared_size_limit_is_refused_before_writing(tmp_path: Path) -> None:
    mar = make_zip(tmp_path / "big.mar", {"a.bin": b"a" * 600, "b.bin": b"b" * 600})
    assert_refused(mar, tmp_path / "dest", "'b.bin'", "exceeds the limit of 1000 bytes", limit=1000)
    assert open_archive(mar, tmp_path / "ok", max_uncompressed_bytes=1200).model_dir.is_dir()


def test_zip_bomb_lying_about_its_size_is_refused(tmp_path: Path) -> None:
    mar = make_zip(tmp_path / "bomb.mar", {"bomb.bin": bytes(8 << 20)})
    data = bytearray(mar.read_bytes())
    struct.pack_into("<I", data, 22, 100)  # local header: uncompressed size
    struct.pack_into("<I", data, data.rfind(b"PK\x01\x02") + 24, 100)  # central directory: same
    mar.write_bytes(bytes(data))
    assert zipfile.ZipFile(mar).infolist()[0].file_size == 100
    assert_refused(mar, tmp_path / "dest", "'bomb.bin'", limit=1 << 20)


def test_tar_slip_and_absolute_names_are_refused(tmp_path: Path) -> None:
    for i, name in enumerate(["m/../../evil", "../evil", f"{tmp_path}/abs_evil", "/abs_evil"]):
        tgz = make_tar_gz(tmp_path / f"evil{i}.tar.gz", [tar_file("m/ok.txt", b"ok"), tar_file(name, b"pwned")])
        assert_refused(tgz, tmp_path / "dest", repr(name))
    assert not (tmp_path / "evil").exists() and not (tmp_path / "abs_evil").exists()


@pytest.mark.parametrize(
    ("kind", "why"),
    [(tarfile.SYMTYPE, "symbolic link"), (tarfile.LNKTYPE, "hard link"), (tarfile.CHRTYPE, "special file"),
     (tarfile.BLKTYPE, "special file"), (tarfile.FIFOTYPE, "special file")],
)  # fmt: skip
def test_tar_links_and_devices_are_refused(tmp_path: Path, kind: bytes, why: str) -> None:
    (tmp_path / "outside").mkdir()
    link = tarfile.TarInfo("m/link")
    link.type = kind
    link.linkname = str(tmp_path / "outside")
    tgz = make_tar_gz(tmp_path / "link.tar.gz", [(link, None), tar_file("m/link/passwd", b"pwned")])
    assert_refused(tgz, tmp_path / "dest", "'m/link'", why)
    assert list((tmp_path / "outside").iterdir()) == []


def test_tar_gz_bomb_is_refused_by_declared_size(tmp_path: Path) -> None:
    tgz = make_tar_gz(tmp_path / "bomb.tar.gz", [tar_file("m/small", b"x"), tar_file("m/bomb.bin", bytes(4 << 20))])
    assert tgz.stat().st_size < 64 << 10
    assert_refused(tgz, tmp_path / "dest", "'m/bomb.bin'", "exceeds the limit", limit=1 << 20)


def test_truncated_archives_are_archive_errors(tmp_path: Path) -> None:
    mar = make_zip(tmp_path / "t.mar", archive_entries())
    mar.write_bytes(mar.read_bytes()[:-30])
    assert_refused(mar, tmp_path / "dest")
    tgz = make_tar_gz(tmp_path / "t.tar.gz", [tar_file(f"m/{k}", v) for k, v in archive_entries().items()])
    tgz.write_bytes(tgz.read_bytes()[:200])
    assert_refused(tgz, tmp_path / "dest")
    tgz.write_bytes(b"\x1f\x8b\x08")  # a cut gzip header: tarfile's "r|gz" raises TypeError on it
    assert_refused(tgz, tmp_path / "dest")


def test_member_count_limit(tmp_path: Path) -> None:
    mar = make_zip(tmp_path / "many.mar", {f"f{i}": b"" for i in range(20)})
    with pytest.raises(ArchiveError, match="more than the limit of 10"):
        open_archive(mar, tmp_path / "dest", max_members=10)


# ---- property: whatever the member names, nothing is ever written outside dest

_component = st.sampled_from(["a", "b.txt", ".", "..", "", "...", "\\", "..\\x", "C:", "~", " ", "MAR-INF", "\x00"])
_names = st.builds(
    lambda lead, parts: lead + "/".join(parts),
    st.sampled_from(["", "/", "./", "//"]),
    st.lists(_component, min_size=1, max_size=5),
).filter(lambda n: n.strip("\x00") != "")


def _escapes(sandbox: Path, dest: Path, archive: Path) -> list[str]:
    bad = []
    for d, dirs, files in os.walk(sandbox):
        for n in dirs + files:
            p = Path(d, n)
            if p != archive and p != dest and p not in dest.parents and dest not in p.parents:
                bad.append(str(p))
    return bad


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=st.lists(_names, min_size=1, max_size=4, unique_by=lambda n: n.split("\x00")[0]), use_tar=st.booleans())
@example(names=["\x00/a"], use_tar=False)  # NUL cuts the zip name to "": found by this test
@example(names=["/"], use_tar=True)
def test_random_member_names_never_escape_dest(names: list[str], use_tar: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sandbox = Path(tmp, "sandbox")
        sandbox.mkdir()
        dest = sandbox / "deep" / "dest"
        dest.parent.mkdir()
        if use_tar:
            archive = make_tar_gz(sandbox / "x.tar.gz", [tar_file(n, b"data") for n in names])
        else:
            archive = sandbox / "x.mar"
            with zipfile.ZipFile(archive, "w") as zf:
                for n in names:
                    zf.writestr(zipfile.ZipInfo(n), b"data")
        try:
            open_archive(archive, dest)
        except ArchiveError:
            assert not dest.exists()
        assert _escapes(sandbox, dest, archive) == []
        assert {p.name for p in Path(tmp).iterdir()} == {"sandbox"}


@settings(max_examples=100, deadline=None)
@given(
    use_tar=st.booleans(),
    flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=6),
    cut=st.none() | st.floats(0, 1),
)
def test_corrupt_archives_raise_only_archive_error(
    use_tar: bool, flips: list[tuple[float, int]], cut: float | None
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        if use_tar:
            good = make_tar_gz(base / "a", [tar_file(f"m/{k}", v) for k, v in archive_entries().items()])
        else:
            good = make_zip(base / "a", archive_entries())
        data = bytearray(good.read_bytes())
        for where, value in flips:
            data[int(where * len(data))] = value
        if cut is not None:
            data = data[: int(cut * len(data))]
        good.write_bytes(bytes(data))
        try:
            open_archive(good, base / "dest")
        except ArchiveError:
            assert not (base / "dest").exists()
