"""The one record per architecture (models/__init__.py): each builds its model from its config, the
tasks the records name are exactly the tasks a run config knows, and the commands they name exist."""

import ast
from pathlib import Path

import pytest
import typer.main

from attnkit.cli import app
from attnkit.config import RunConfig
from attnkit.models import ARCHITECTURES, archs, build_model
from attnkit.task_records import TASK_RECORDS, tasks_training


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_each_record_builds_its_model_and_trains_on_its_tasks(name):
    record = ARCHITECTURES[name]
    assert record.name == name and name == record.config.ARCH
    config = record.config()
    model = build_model(config, 20 if record.has_vocabulary else None)
    assert isinstance(model, record.model)
    for task in tasks_training(name):  # a run config accepts each (an encoder taking the head the task needs)
        model = {key: value for key, value in config.to_dict().items() if key != "head"}
        assert RunConfig.from_dict({"model": model, "data": {"task": task}}).model.arch == name


def test_every_architecture_is_trained_by_a_task_and_every_task_trains_architectures():
    trained = {arch for task in TASK_RECORDS.values() for arch in task.trains}
    assert trained == set(ARCHITECTURES)
    assert all(task.trains for task in TASK_RECORDS.values())


def test_the_commands_the_records_name_exist():
    commands = typer.main.get_command(app).commands
    for record in ARCHITECTURES.values():
        for command in record.commands:
            assert command.split()[0] in commands, (record.name, command)
        assert set(record.exports) <= {"hf", "ctranslate2"}
    assert archs(reading="images") == tuple(a.name for a in ARCHITECTURES.values() if a.reads == "images")
    assert all(record.writes in ("", "text") for record in ARCHITECTURES.values())


def test_no_architecture_name_is_written_outside_its_record():
    """Only models/ names architectures (their config classes and records); everything else asks the
    record (``archs(using=...)``) or the config class (``TransformerConfig.ARCH``), so a
    new architecture is one record, not a hunt for tuples. (An attribute named like one, as
    ``getattr(model, "encoder")``, is not a name.)"""
    package = Path(__file__).resolve().parents[2] / "src" / "attnkit"
    names = set(ARCHITECTURES)
    found = []
    for path in sorted(package.rglob("*.py")):
        inside = path.relative_to(package).parts
        if inside[0] == "models":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        attributes = {
            id(node.args[1])
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and getattr(node.func, "id", "") in ("getattr", "hasattr")
            and len(node.args) > 1
        }
        found += [
            f"{'/'.join(inside)}:{node.lineno} {node.value!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in names and id(node) not in attributes
        ]
    assert found == []
