"""The artifact store: its layout, and the adapter hash and atomic folder write that learner and inference share."""

from __future__ import annotations

from pathlib import Path

import pytest

from distrl_stream.artifacts import (
    adapter_dir,
    artifacts_dir,
    atomic_dir,
    dir_size,
    local_path,
    model_fingerprint,
    newest_artifact_version,
    prune_artifacts,
    sha256_dir,
)
from distrl_stream.config import Config
from distrl_stream.errors import ArtifactError


def _write(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_sha256_is_stable_and_independent_of_creation_order(tmp_path: Path) -> None:
    a = _write(tmp_path / "a", {"x.bin": b"1", "sub/y.json": b"{}"})
    b = _write(tmp_path / "b", {"sub/y.json": b"{}", "x.bin": b"1"})
    assert sha256_dir(a) == sha256_dir(b)
    assert len(sha256_dir(a)) == 64


@pytest.mark.parametrize(
    "other",
    [
        {"x.bin": b"2", "sub/y.json": b"{}"},  # a changed byte
        {"z.bin": b"1", "sub/y.json": b"{}"},  # a renamed file
        {"x.bin": b"1{", "sub/y.json": b"}"},  # bytes moved across the boundary of two files
        {"x.bin": b"1", "sub/y.json": b"{}", "extra": b""},  # an extra empty file
    ],
)
def test_sha256_changes_with_any_change(tmp_path: Path, other: dict[str, bytes]) -> None:
    base = _write(tmp_path / "base", {"x.bin": b"1", "sub/y.json": b"{}"})
    assert sha256_dir(base) != sha256_dir(_write(tmp_path / "other", other))


def test_sha256_rejects_missing_folder_and_symlinks(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="not a folder"):
        sha256_dir(tmp_path / "nope")
    root = _write(tmp_path / "d", {"a": b"1"})
    (root / "link").symlink_to(root / "a")
    with pytest.raises(ArtifactError, match="symlink"):
        sha256_dir(root)


def test_atomic_dir_publishes_all_files_at_once(tmp_path: Path) -> None:
    target = tmp_path / "adapters" / "v1"
    with atomic_dir(target) as tmp:
        _write(tmp, {"adapter.safetensors": b"w" * 10, "adapter_config.json": b"{}"})
        assert not target.exists()  # readers see nothing until the write is complete
    assert sorted(p.name for p in target.iterdir()) == ["adapter.safetensors", "adapter_config.json"]
    assert dir_size(target) == 12
    assert [p.name for p in target.parent.iterdir()] == ["v1"]  # no temporary folder left behind


def test_atomic_dir_leaves_nothing_on_failure_and_never_overwrites(tmp_path: Path) -> None:
    target = tmp_path / "v1"
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        _write(tmp, {"half": b"x"})
        raise RuntimeError("crash mid-write")
    assert list(tmp_path.iterdir()) == []
    target.mkdir()
    with pytest.raises(ArtifactError, match="refusing to overwrite"), atomic_dir(target):
        pass


def test_local_path_accepts_paths_and_file_uris_only(tmp_path: Path) -> None:
    assert local_path(str(tmp_path)) == tmp_path
    assert local_path((tmp_path / "a b").as_uri()) == tmp_path / "a b"
    with pytest.raises(ArtifactError, match="s3"):
        local_path("s3://bucket/adapter")


def test_newest_artifact_version_counts_only_complete_version_folders(tmp_path: Path) -> None:
    cfg = Config(data_dir=tmp_path, run="r")
    assert newest_artifact_version(cfg) == 0
    for version in (1, 3):
        with atomic_dir(adapter_dir(cfg, version)) as tmp:
            (tmp / "adapter.bin").write_bytes(b"w")
    (artifacts_dir(cfg) / ".v000007.abc.tmp").mkdir()  # a write killed mid-way
    (artifacts_dir(cfg) / "v9").mkdir()  # not the store's naming
    assert adapter_dir(cfg, 3) == tmp_path / "runs" / "r" / "artifacts" / cfg.model.policy_id / "v000003"
    assert newest_artifact_version(cfg) == 3


def test_pruning_keeps_the_newest_keep_versions_and_nothing_else_of_the_folder(tmp_path: Path) -> None:
    cfg = Config(data_dir=tmp_path, run="r", artifacts={"keep_versions": 2}, inference={"keep_versions": 2})
    for version in range(1, 6):
        with atomic_dir(adapter_dir(cfg, version)) as tmp:
            (tmp / "adapter.bin").write_bytes(b"w")
    (artifacts_dir(cfg) / "notes").mkdir()  # not a version folder: left alone
    assert prune_artifacts(cfg, 5) == [1, 2, 3]
    assert sorted(p.name for p in artifacts_dir(cfg).iterdir()) == ["notes", "v000004", "v000005"]
    assert newest_artifact_version(cfg) == 5  # the next version's number survives a restart
    assert prune_artifacts(cfg, 5) == []


def test_model_fingerprint_covers_config_and_weights_only_and_is_cached(tmp_path: Path) -> None:
    model = _write(tmp_path / "m", {"config.json": b"{}", "model.safetensors": b"w" * 100, "tokenizer.json": b"t"})
    cache = tmp_path / "cache" / "fingerprints.json"
    first = model_fingerprint(model, cache)
    assert first == model_fingerprint(_write(tmp_path / "n", {"config.json": b"{}", "model.safetensors": b"w" * 100}))
    (model / "tokenizer.json").write_text("other")
    assert model_fingerprint(model, cache) == first  # tokenizer files do not change the weights
    assert str(model.resolve()) in cache.read_text()
    (model / "model.safetensors").write_bytes(b"v" * 101)
    assert model_fingerprint(model, cache) != first  # a changed weight file is hashed again, not read from cache
    with pytest.raises(ArtifactError, match=r"no config\.json"):
        model_fingerprint(tmp_path / "cache")
