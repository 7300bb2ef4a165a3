"""Installing Apache Kafka: checksum verification, archives, folders, mirrors (local file:// ones, no network)."""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
from pathlib import Path

import pytest

from distrl_stream.errors import BrokerError, KafkaInstallError
from distrl_stream.kafka.install import (
    find_kafka_home,
    install_kafka,
    installation_name,
    kafka_version,
    parse_sha512,
    record_kafka_home,
    verify_sha512,
)

DIGEST = hashlib.sha512(b"kafka").hexdigest()


def _fake_release(root: Path, version: str = "9.9.9") -> Path:
    """A folder laid out like an official release (jar contents do not matter for installing)."""
    home = root / f"kafka_2.13-{version}"
    (home / "libs").mkdir(parents=True)
    (home / "libs" / f"kafka_2.13-{version}.jar").write_bytes(b"jar")
    (home / "libs" / f"kafka-clients-{version}.jar").write_bytes(b"jar")
    (home / "LICENSE").write_text("Apache-2.0")
    return home


def _archive(folder: Path, dest: Path) -> Path:
    with tarfile.open(dest, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    return dest


def _sha512sum_line(path: Path) -> str:
    return f"{hashlib.sha512(path.read_bytes()).hexdigest()}  {path.name}\n"


def _gpg_style(path: Path) -> str:
    """The `gpg --print-md SHA512` layout older Apache releases use: upper-case groups over several lines."""
    hexdigest = hashlib.sha512(path.read_bytes()).hexdigest().upper()
    groups = [hexdigest[i : i + 8] for i in range(0, 128, 8)]
    return f"{path.name}: " + " ".join(groups[:6]) + "\n" + " ".join(groups[6:12]) + "\n" + " ".join(groups[12:]) + "\n"


def test_parse_sha512_reads_sha512sum_and_gpg_formats(tmp_path: Path) -> None:
    file = tmp_path / "kafka_2.13-9.9.9.tgz"
    file.write_bytes(b"kafka")
    assert parse_sha512(_sha512sum_line(file)) == DIGEST
    assert parse_sha512(_gpg_style(file)) == DIGEST
    with pytest.raises(KafkaInstallError, match="not a SHA-512"):
        parse_sha512("d41d8cd98f00b204e9800998ecf8427e  file.tgz")


def test_verify_sha512_accepts_the_right_file_and_rejects_a_changed_one(tmp_path: Path) -> None:
    file = tmp_path / "release.tgz"
    file.write_bytes(b"kafka")
    checksum = _sha512sum_line(file)
    verify_sha512(file, checksum)
    file.write_bytes(b"kafkA")
    with pytest.raises(KafkaInstallError, match=r"checksum mismatch for release\.tgz"):
        verify_sha512(file, checksum)


def test_install_from_an_archive_with_its_checksum_file(tmp_path: Path) -> None:
    archive = _archive(_fake_release(tmp_path / "src"), tmp_path / "kafka_2.13-9.9.9.tgz")
    (tmp_path / "kafka_2.13-9.9.9.tgz.sha512").write_text(_gpg_style(archive))
    home = install_kafka(source=archive, cache=tmp_path / "cache")
    assert home == tmp_path / "cache" / "kafka_2.13-9.9.9"
    assert (home / "libs" / "kafka_2.13-9.9.9.jar").is_file()
    assert kafka_version(home) == "9.9.9"


def test_install_refuses_an_archive_whose_checksum_does_not_match(tmp_path: Path) -> None:
    archive = _archive(_fake_release(tmp_path / "src"), tmp_path / "kafka.tgz")
    checksum = tmp_path / "other.sha512"
    checksum.write_text(f"{DIGEST}  kafka.tgz\n")
    with pytest.raises(KafkaInstallError, match="checksum mismatch"):
        install_kafka(source=archive, checksum=checksum, cache=tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("kafka*"))


def test_install_refuses_an_archive_with_paths_outside_its_folder(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    with pytest.raises(KafkaInstallError, match="not a readable release archive"):
        install_kafka(source=archive, cache=tmp_path / "cache")
    assert not (tmp_path / "escaped.txt").exists()


def test_install_from_an_unpacked_folder_copies_it(tmp_path: Path) -> None:
    source = _fake_release(tmp_path / "src", "8.1.0")
    home = install_kafka(source=source, cache=tmp_path / "cache")
    assert home.name == "kafka_2.13-8.1.0"
    assert home != source and (home / "LICENSE").read_text() == "Apache-2.0"


def test_download_tries_mirrors_in_order_and_verifies_the_checksum(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    (mirror / "9.9.9").mkdir(parents=True)
    archive = _archive(_fake_release(tmp_path / "src"), mirror / "9.9.9" / "kafka_2.13-9.9.9.tgz")
    (mirror / "9.9.9" / "kafka_2.13-9.9.9.tgz.sha512").write_text(_sha512sum_line(archive))
    progress: list[int] = []
    home = install_kafka(
        "9.9.9",
        mirrors=[(tmp_path / "empty-mirror").as_uri(), mirror.as_uri()],
        cache=tmp_path / "cache",
        progress=lambda done, _total: progress.append(done),
    )
    assert kafka_version(home) == "9.9.9"
    assert progress[-1] == archive.stat().st_size
    # Installed already: no download at all the second time.
    assert install_kafka("9.9.9", mirrors=["file:///nonexistent"], cache=tmp_path / "cache") == home


def test_download_with_a_bad_checksum_installs_nothing(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    (mirror / "9.9.9").mkdir(parents=True)
    _archive(_fake_release(tmp_path / "src"), mirror / "9.9.9" / "kafka_2.13-9.9.9.tgz")
    (mirror / "9.9.9" / "kafka_2.13-9.9.9.tgz.sha512").write_text(f"{DIGEST}  kafka_2.13-9.9.9.tgz\n")
    with pytest.raises(KafkaInstallError, match="checksum mismatch"):
        install_kafka("9.9.9", mirrors=[mirror.as_uri()], cache=tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("kafka*"))


def test_download_failing_on_every_mirror_names_them(tmp_path: Path) -> None:
    with pytest.raises(KafkaInstallError, match=r"could not download Kafka 9\.9\.9: .*nowhere"):
        install_kafka("9.9.9", mirrors=[(tmp_path / "nowhere").as_uri()], cache=tmp_path / "cache")


def test_find_kafka_home_prefers_the_configured_one_then_the_newest_installed(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _fake_release(cache, "4.0.0")
    newest = _fake_release(cache, "4.10.1")
    _fake_release(cache, "4.9.0")
    no_record = tmp_path / "no-record"  # not this environment's record, which `make setup` wrote
    assert find_kafka_home(None, cache, no_record) == newest
    configured = _fake_release(tmp_path / "elsewhere", "3.9.0")
    assert find_kafka_home(configured, cache, no_record) == configured


def test_find_kafka_home_errors_say_what_to_do(tmp_path: Path) -> None:
    no_record = tmp_path / "no-record"  # not this environment's record, which `make setup` wrote
    with pytest.raises(BrokerError, match="kafka install"):
        find_kafka_home(None, tmp_path / "empty", no_record)
    with pytest.raises(BrokerError, match=r"KAFKA_HOME: .* is not an Apache Kafka installation"):
        find_kafka_home(tmp_path, tmp_path / "empty", no_record)


def test_find_kafka_home_takes_the_configured_then_the_recorded_then_the_cached_one(tmp_path: Path) -> None:
    cache, record = tmp_path / "cache", tmp_path / "venv-record"
    cached = _fake_release(cache, "4.0.0")
    recorded = record_kafka_home(_fake_release(tmp_path / "shared", "4.4.0"), record)
    configured = _fake_release(tmp_path / "elsewhere", "3.9.0")
    assert find_kafka_home(configured, cache, record) == configured
    assert find_kafka_home(None, cache, record) == recorded
    shutil.rmtree(recorded)  # a recorded installation that is gone: the cache still serves
    assert find_kafka_home(None, cache, record) == cached


def test_no_kafka_anywhere_names_every_place_looked_in(tmp_path: Path) -> None:
    record, cache = tmp_path / "venv-record", tmp_path / "empty"
    with pytest.raises(BrokerError) as info:
        find_kafka_home(None, cache, record)
    message = str(info.value)
    assert "\n" not in message
    for place in ("broker.kafka_home", "KAFKA_HOME", str(record), "kafka use DIR", "kafka install", str(cache)):
        assert place in message
    with pytest.raises(KafkaInstallError, match="is not an Apache Kafka installation"):
        record_kafka_home(tmp_path, record)


def test_the_shared_kafka_folder_is_recognised(kafka_home: Path) -> None:
    assert installation_name(kafka_home) == f"kafka_2.13-{kafka_version(kafka_home)}"
