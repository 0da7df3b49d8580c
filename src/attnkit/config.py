"""A run's whole configuration: model, data, training and decoding, as dataclasses mapped from YAML.

``load_run_config("configs/multi30k_de_en.yaml", ["train.lr=2", "data.dir=/data/multi30k"])`` reads the
YAML file, applies ``section.field=value`` overrides (values parsed as YAML, so ``2`` is a number), and
checks every key: an unknown section or field, or a value of the wrong type, is a ``ConfigError`` that
names the key and where it came from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from attnkit.errors import ConfigError
from attnkit.models.config import TransformerConfig


@dataclass
class DataConfig:
    task: str = "parallel"  # "parallel" (files) or a synthetic task: "dates", "copy"
    dir: str = "."  # folder the file names below are relative to
    train: list[str] = field(default_factory=list)  # [source file, target file]
    valid: list[str] = field(default_factory=list)
    test: list[str] = field(default_factory=list)
    tokenizer: str = "bpe"  # "bpe" (joint), "char" or "word"
    vocab_size: int = 8000
    max_len: int = 128  # pairs with more tokens on either side are dropped from training
    n_train: int = 20000  # synthetic tasks: generated training pairs
    n_valid: int = 500  # synthetic tasks: generated held-out pairs

    def path(self, name: str) -> Path:
        return Path(self.dir) / name


@dataclass
class TrainConfig:
    seed: int = 1
    max_tokens: int = 4096  # tokens per batch (padded, the longer side); the paper used ~25,000
    update_freq: int = 1  # batches per optimizer step (gradient accumulation)
    schedule: str = "noam"  # "noam" (the paper), "inverse_sqrt" or "constant"
    lr: float = 1.0  # noam: the factor; inverse_sqrt and constant: the peak learning rate
    warmup: int = 4000
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])  # the paper's Adam β1, β2
    eps: float = 1e-9
    label_smoothing: float = 0.1  # the paper's ε_ls
    clip_norm: float = 0.0  # 0 = no clipping
    max_steps: int = 0  # 0 = no limit (stop on max_epochs or max_minutes)
    max_epochs: int = 0
    max_minutes: float = 0.0
    eval_every: int = 500  # steps between validations (and checkpoints)
    eval_metric: str = "bleu"  # what picks the best checkpoint: "bleu", "accuracy" or "loss"
    valid_bleu_sentences: int = 0  # validation decodes (for BLEU, accuracy) only the first N; 0 = all
    patience: int = 0  # validations without improvement before stopping early; 0 = never
    keep_last: int = 5  # checkpoints kept besides the best (for averaging)
    log_every: int = 50
    precision: str = "auto"  # "auto" (bf16 autocast on GPU, fp32 on CPU), "fp32" or "bf16"
    device: str = "auto"


@dataclass
class DecodeConfig:
    beam_size: int = 5
    alpha: float = 0.6  # GNMT length penalty exponent
    max_len_a: float = 1.5  # output length bound: a · source length + b
    max_len_b: int = 10
    batch_size: int = 64  # sentences per decoding batch


@dataclass
class RunConfig:
    model: TransformerConfig = field(default_factory=TransformerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> RunConfig:
        sections = {"model", "data", "train", "decode"}
        unknown = sorted(set(values) - sections)
        if unknown:
            raise ConfigError(f"{source}: unknown section(s) {unknown}; known: {sorted(sections)}")
        model_values = dict(values.get("model") or {})
        preset = model_values.pop("preset", None)
        checked = _checked(TransformerConfig, model_values, source, "model")
        if preset is not None:
            model = TransformerConfig.from_preset(preset, **checked)
        else:
            model = TransformerConfig.from_dict(checked, source)
        return cls(
            model=model,
            data=DataConfig(**_checked(DataConfig, values.get("data") or {}, source, "data")),
            train=TrainConfig(**_checked(TrainConfig, values.get("train") or {}, source, "train")),
            decode=DecodeConfig(**_checked(DecodeConfig, values.get("decode") or {}, source, "decode")),
        )


def _checked(cls: type, values: dict[str, Any], source: str, section: str) -> dict[str, Any]:
    """``values`` if every key is a field of ``cls`` with a value of the field's type."""
    if not isinstance(values, dict):
        raise ConfigError(f"{source}: section '{section}' must be a mapping, got {values!r}")
    defaults = {f.name: f for f in dataclasses.fields(cls)}
    values = dict(values)
    for key, value in values.items():
        if key in defaults and isinstance(defaults[key].default, float) and isinstance(value, str):
            values[key] = _yaml_float(value)  # PyYAML reads "5e-4" (no dot) as a string
    for key, value in values.items():
        if key not in defaults:
            raise ConfigError(f"{source}: unknown field '{section}.{key}'; known: {sorted(defaults)}")
        f = defaults[key]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        expected = float if isinstance(default, float) else type(default)
        ok = isinstance(value, expected) and not (isinstance(value, bool) and expected is not bool)
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            raise ConfigError(f"{source}: '{section}.{key}' must be {expected.__name__}, got {value!r}")
    return {k: (float(v) if isinstance(defaults[k].default, float) else v) for k, v in values.items()}


def _yaml_float(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text  # reported as a type error by the caller


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set ``section.field=value`` pairs (values parsed as YAML) on a nested dict."""
    values = {k: dict(v or {}) for k, v in values.items()}
    for item in overrides:
        key, sep, raw = item.partition("=")
        section, dot, name = key.strip().lstrip("-").partition(".")
        if not sep or not dot or not name:
            raise ConfigError(f"override {item!r} must look like section.field=value, e.g. train.lr=0.5")
        try:
            values.setdefault(section, {})[name] = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise ConfigError(f"override {item!r}: cannot parse the value {raw!r}") from None
    return values


def load_run_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML recipe (or start from defaults when ``path`` is None) and apply overrides."""
    values: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            values = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f":{mark.line + 1}" if mark else ""
            raise ConfigError(f"{path}{where}: not valid YAML ({getattr(error, 'problem', error)})") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: a config is a mapping of sections (model, data, train, decode)")
    return RunConfig.from_dict(apply_overrides(values, overrides or []), source)
