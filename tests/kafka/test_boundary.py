"""Only distrl_stream.kafka talks to confluent-kafka: every other module goes through its typed wrapper."""

from __future__ import annotations

import ast
from pathlib import Path

import distrl_stream
import distrl_stream.cli

PACKAGE = Path(distrl_stream.__file__).parent
# The CLI's source may live outside the package folder (a package-dir mapping); bench/ ships beside it.
SOURCES = {PACKAGE, Path(distrl_stream.cli.__file__).parent, PACKAGE.parent / "bench"}


def _imports_confluent_kafka(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            names = [node.module]
        else:
            continue
        if any(name == "confluent_kafka" or name.startswith("confluent_kafka.") for name in names):
            return True
    return False


def test_no_module_outside_the_kafka_package_imports_confluent_kafka() -> None:
    sources = {path for root in SOURCES for path in root.rglob("*.py")}
    outside = [p for p in sources if not p.is_relative_to(PACKAGE / "kafka")]
    assert len(outside) > 20, "the walk found too few modules to mean anything"
    offenders = sorted(str(p.relative_to(PACKAGE.parent)) for p in outside if _imports_confluent_kafka(p))
    assert offenders == []


def test_the_check_sees_both_import_forms(tmp_path: Path) -> None:
    plain, nested, clean = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    plain.write_text("def f():\n    import confluent_kafka.admin\n")
    nested.write_text("from confluent_kafka import TopicPartition\n")
    clean.write_text("from distrl_stream.kafka import TopicPartition\n")
    assert [_imports_confluent_kafka(p) for p in (plain, nested, clean)] == [True, True, False]
