"""A run's whole configuration: model, data, training and decoding, as dataclasses mapped from YAML.

``load_run_config("configs/multi30k_de_en.yaml", ["train.lr=2", "data.dir=/data/multi30k"])`` reads the
YAML file, applies ``section.field=value`` overrides (values parsed as YAML, so ``2`` is a number), and
checks every key and value before anything else happens: an unknown section or field, a value of the
wrong type, out of range or not among a field's choices is a ``ConfigError`` that names the file, the
field, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from attnkit.data.tokenizer import KINDS, MIN_BPE_VOCAB, SPECIALS
from attnkit.errors import ConfigError, require_at_least, require_fraction, require_one_of
from attnkit.models import PRESETS, config_class
from attnkit.models.config import DecoderModelConfig, EncoderModelConfig, TransformerConfig
from attnkit.models.glimpse import GlimpseConfig, WholeImageConfig
from attnkit.models.rnn import RNNConfig
from attnkit.task_records import TASK_RECORDS, task_record, tasks_training

PRECISIONS = ("auto", "fp32", "bf16")
LOGS = (
    "csv",
    "tensorboard",
)  # train.log: metrics.csv at validations; TensorBoard events (train/tensorboard.py)
PARALLEL = ("ddp", "fsdp")  # train.parallel: how several processes share the model (train/distributed.py)
SCHEDULES = ("noam", "inverse_sqrt", "cosine", "constant")  # train.schedule (train/schedules.py)
LENGTH_PENALTIES = ("length", "gnmt")  # beam search's lp(Y): |Y|^alpha, or GNMT's ((5 + |Y|) / 6)^alpha
BEAM_STOPS = ("no-better", "k-finished")  # when beam search ends a sentence (decode/search.py)
DECODING_STEPS = ("auto", "compiled", "eager")  # what a translation's search steps with (decode.steps)
# what drafts a search checks (decode.speculative): these, or (any other value) a draft checkpoint
SPECULATIVE = ("none", "source", "shallow")
# what a trained model's linear maps multiply in for inference (attnkit.loading.inference_precision)
INFERENCE_PRECISIONS = ("auto", "fp32", "bf16", "int8")

EVAL_METRICS = ("bleu", "accuracy", "f1", "rouge1", "rouge2", "rougeL", "cer", "wer", "loss")
LOWER_IS_BETTER = ("cer", "wer", "loss")  # the eval metrics a better model brings down


@dataclass
class DataConfig:
    # translation: "parallel" (files) or generated "dates", "copy"; language modelling: "text";
    # encoder models: "classify" (TSV files), "mlm" (sentences), "qa" (generated); images (glimpse and
    # whole-image models): "cluttered-digits" (generated); summarisation: "summarise" (JSON Lines);
    # image captioning (show-attend-tell, caption-transformer): "captions" (generated digit scenes);
    # speech recognition (listen-attend-spell): "speech" (synthesised, or transcript files of WAV files)
    task: str = "parallel"
    dir: str = "."  # folder the file names below are relative to (stored resolved in a run's config.json)
    train: list[str] = field(default_factory=list)  # [source file, target file]; text, classify, mlm: [file]
    valid: list[str] = field(default_factory=list)  # the same; text, mlm: [file], or none to hold some out
    test: list[str] = field(default_factory=list)
    valid_fraction: float = 0.1  # text, mlm without a valid file: the end of the training data held out
    labels: list[str] = field(default_factory=list)  # classify: the labels in order; [] = the training file's
    fields: list[str] = field(default_factory=lambda: ["source", "target"])  # summarise: the JSON fields
    references: str = ""  # summarise: the field of the validation/test references ("" = the target's)
    max_source_len: int = 0  # summarise: longer sources are cut to this many tokens (0: data.max_len)
    tokenizer: str = "bpe"  # "bpe" (joint, byte-level), "char" or "word"
    vocab_size: int = 8000  # bpe and word; char keeps every character seen
    max_len: int = 128  # pairs with more tokens on either side are dropped from training
    store: str = ""  # parallel: where prepared token stores are kept ("" = $XDG_CACHE_HOME/attnkit/stores)
    tokenizer_sample: int = 1_000_000  # parallel: pairs the tokenizer learns from (a larger corpus: a sample)
    n_train: int = 20000  # synthetic tasks: generated training pairs (captions: scenes an epoch)
    n_valid: int = 500  # synthetic tasks: generated held-out pairs (cluttered-digits, captions: and test)
    canvas: int = 40  # cluttered-digits: the image's side in pixels (a digit is 16)
    clutter: int = 4  # cluttered-digits: 6×6 pieces of other digits strewn on each image

    def __post_init__(self) -> None:
        record = task_record(self.task)
        require_one_of("data.tokenizer", self.tokenizer, KINDS)
        smallest = MIN_BPE_VOCAB if self.tokenizer == "bpe" else len(SPECIALS) + 1
        if self.vocab_size < smallest:
            what = f"{len(SPECIALS)} specials + 256 bytes" if self.tokenizer == "bpe" else "the specials + 1"
            raise ConfigError(
                f"data.vocab_size must be >= {smallest} for data.tokenizer={self.tokenizer!r} ({what}); "
                f"got {self.vocab_size}"
            )
        require_at_least("data.max_len", self.max_len, 2)
        require_at_least("data.n_train", self.n_train, 1)
        require_at_least("data.n_valid", self.n_valid, 1)
        require_at_least("data.tokenizer_sample", self.tokenizer_sample, 1)
        require_at_least("data.canvas", self.canvas, 16)
        require_at_least("data.clutter", self.clutter, 0)
        if not 0.0 < self.valid_fraction < 1.0:
            raise ConfigError(f"data.valid_fraction must be in (0, 1); got {self.valid_fraction!r}")
        for split in ("train", "valid", "test"):
            files = getattr(self, split)
            if files and (len(files) != record.files or not all(isinstance(f, str) and f for f in files)):
                raise ConfigError(f"data.{split} must list {record.files_wanted}; got {files!r}")
        if len(self.fields) != 2 or not all(isinstance(name, str) and name for name in self.fields):
            raise ConfigError(f"data.fields must be [source field, target field]; got {self.fields!r}")
        require_at_least("data.max_source_len", self.max_source_len, 0)
        if not all(isinstance(label, str) and label for label in self.labels):
            raise ConfigError(f"data.labels must be a list of non-empty strings; got {self.labels!r}")

    @property
    def source_limit(self) -> int:
        """Summarisation: the tokens of a source kept (with its ``</s>``; at most ``max_len``); longer
        ones are cut."""
        return min(self.max_source_len or self.max_len, self.max_len)

    def check_files_given(self) -> None:
        """Training on files needs ``train`` and (for translation, classification) ``valid``; checked
        before any file is read."""
        record = task_record(self.task)
        for split in record.needs:
            if not getattr(self, split):
                raise ConfigError(f"data.{split} is not set: it must list {record.files_wanted}")

    def path(self, name: str) -> Path:
        return Path(self.dir) / name


@dataclass
class TrainConfig:
    seed: int = 1
    max_tokens: int = 4096  # tokens per batch (padded, the longer side); the paper used ~25,000
    batch_size: int = 64  # image tasks: images per batch (text is batched by max_tokens)
    update_freq: int = 1  # batches per optimizer step (gradient accumulation)
    schedule: str = "noam"  # "noam" (the paper), "inverse_sqrt", "cosine" or "constant"
    lr: float = 1.0  # noam: the factor; inverse_sqrt and constant: the peak learning rate
    warmup: int = 4000
    min_lr: float = 0.0  # cosine: the learning rate at the end of the decay
    decay_steps: int = 0  # cosine: steps until min_lr (0 = train.max_steps)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])  # the paper's Adam β1, β2
    eps: float = 1e-9
    weight_decay: float = 0.0  # AdamW's decoupled decay of weight matrices and embeddings (0 = Adam)
    # < 1: layer-wise learning-rate decay for fine-tuning an encoder (ELECTRA, Clark et al. 2020): each
    # encoder layer learns this factor slower than the one above it, the embeddings slowest
    layer_decay: float = 1.0
    # parameters that keep their (pretrained) values: name prefixes, e.g. [embed.words] for BERT's word
    # embeddings (state-dict names); a frozen parameter gets no gradient and no optimizer state
    freeze: list[str] = field(default_factory=list)
    label_smoothing: float = 0.1  # the paper's ε_ls
    init_from: str = ""  # start from these weights: an attnkit checkpoint or run, or an HF model folder
    clip_norm: float = 0.0  # 0 = no clipping
    max_steps: int = 0  # 0 = no limit (stop on max_epochs or max_minutes)
    max_epochs: int = 0
    max_minutes: float = 0.0
    eval_every: int = 500  # steps between validations (and checkpoints)
    eval_metric: str = "bleu"  # what picks the best checkpoint: "bleu", "accuracy", "f1" or "loss"
    valid_bleu_sentences: int = 0  # validation decodes (for BLEU, accuracy) only the first N; 0 = all
    patience: int = 0  # validations without improvement before stopping early; 0 = never
    keep_last: int = 5  # checkpoints kept besides the best (for averaging)
    log_every: int = 50  # steps between progress lines (without a terminal) and TensorBoard's training points
    log: list[str] = field(default_factory=lambda: ["csv"])  # also "tensorboard": RUN/tensorboard event files
    # "auto": bf16 autocast on a GPU, and on a CPU with fast bf16 units where a step of this model is faster
    # so (timed both ways on the first batch, train/precision.py); "fp32"; "bf16"
    precision: str = "auto"
    device: str = "auto"  # "auto" (the GPU if there is one), "cpu", "cuda", "cuda:1", ...
    # several processes (torchrun): "ddp" keeps the whole model in each; "fsdp" shards the weights, the
    # gradients and the optimizer's state over them (FSDP2), for a model too big for one device
    parallel: str = "ddp"

    def __post_init__(self) -> None:
        for name in ("seed", "clip_norm", "max_steps", "max_epochs", "max_minutes", "valid_bleu_sentences",
                     "patience", "log_every", "lr", "min_lr", "decay_steps", "weight_decay"):  # fmt: skip
            require_at_least(f"train.{name}", getattr(self, name), 0)
        for name in ("max_tokens", "batch_size", "update_freq", "eval_every", "keep_last"):
            require_at_least(f"train.{name}", getattr(self, name), 1)
        require_one_of("train.schedule", self.schedule, SCHEDULES)
        require_at_least("train.warmup", self.warmup, 0 if self.schedule in ("constant", "cosine") else 1)
        if len(self.betas) != 2:
            raise ConfigError(f"train.betas must be two numbers [β1, β2]; got {self.betas!r}")
        for beta in self.betas:
            if isinstance(beta, bool) or not isinstance(beta, int | float):
                raise ConfigError(f"train.betas must be two numbers [β1, β2]; got {self.betas!r}")
            require_fraction("train.betas", beta)
        require_at_least("train.eps", self.eps, 0, strictly=True)
        require_fraction("train.label_smoothing", self.label_smoothing)
        require_at_least("train.layer_decay", self.layer_decay, 0, strictly=True)
        if self.layer_decay > 1:
            raise ConfigError(f"train.layer_decay must be in (0, 1]; got {self.layer_decay!r}")
        require_one_of("train.eval_metric", self.eval_metric, EVAL_METRICS)
        if not all(isinstance(prefix, str) and prefix for prefix in self.freeze):
            raise ConfigError(f"train.freeze must list parameter name prefixes; got {self.freeze!r}")
        if self.precision == "fp16":
            raise ConfigError(
                "train.precision 'fp16' needs loss scaling, which attnkit does not do; use 'bf16'"
            )
        require_one_of("train.precision", self.precision, PRECISIONS)
        require_one_of("train.parallel", self.parallel, PARALLEL)
        if not isinstance(self.log, list):
            raise ConfigError(f"train.log must be a list such as [csv, tensorboard]; got {self.log!r}")
        for kind in self.log:
            require_one_of("train.log", kind, LOGS)
        if self.device != "auto":
            try:
                torch.device(self.device)
            except (RuntimeError, ValueError):
                raise ConfigError(
                    f"train.device must be 'auto' or a torch device such as 'cpu', 'cuda', 'cuda:1'; "
                    f"got {self.device!r}"
                ) from None


def draft_checkpoint(speculative: str) -> str | None:
    """The draft checkpoint that ``decode.speculative`` names, or None where it names a kind of drafts
    (:data:`SPECULATIVE`)."""
    return None if speculative in SPECULATIVE else speculative


@dataclass
class DecodeConfig:
    # translation (encoder-decoder): beam search
    beam_size: int = 5
    # finished hypotheses rank by log P / lp: "length" lp = |Y|^alpha (fairseq, HF, CTranslate2; chosen on
    # Multi30k's validation set, where it beat "gnmt", lp = ((5 + |Y|) / 6)^alpha, by 0.4 BLEU)
    alpha: float = 1.0
    length_penalty: str = "length"
    # a sentence's search ends when no running beam beats its K finished ones (HF's rule), or at the
    # first K finished ("k-finished", fairseq's): the first scored 1.0 BLEU more on Multi30k
    beam_stop: str = "no-better"
    max_len_a: float = 1.5  # output length bound: a · source length + b
    max_len_b: int = 10
    batch_size: int = 64  # sentences (or prompts) per decoding batch
    # on a CPU, batches translated at a time, each on its share of the threads; 0 = one per thread
    streams: int = 0
    # translation on a CPU: the decoding steps compiled ahead of time (cpu/compiled/), or the model's
    # own. auto: the compiled steps where this machine has them already (built once per model and beam,
    # kept in a cache), else built where the work repays it (a large input; a server, in the
    # background), else the model's own; compiled: built now if need be; eager: the model's own
    steps: str = "auto"
    # greedy translation and generation on a CPU: drafts checked several tokens a step
    # (decode/speculative.py), greedy's output token for token, or with a temperature texts drawn from
    # the model's own distribution (decode/speculative_sampling.py); source: the source's own tokens
    # where the output so far matches it (for tasks that copy; a decoder's prompt and text so far);
    # shallow: the guesses of the checkpoint's one-layer draft decoder (made by attnkit distill-draft);
    # a checkpoint folder or run directory: the guesses of that smaller model of the same architecture
    # and vocabulary (a small GPT's for a big one's); none: one token a step. The steps are
    # decode.steps' (compiled ones check drafts with a compiled step of their own); a greedy batch
    # drafts where drafted batches' tokens have cost less so far (decode/speculative.py's Economy)
    speculative: str = "none"
    # the linear maps' numbers for inference on a CPU, every command and the server: bf16 (on a CPU whose
    # bf16 products are fast: auto's choice there), int8 weights and inputs (--int8), or float32
    precision: str = "auto"
    # generation (decoder-only): sampling; the defaults are nanoGPT's sample.py
    max_new_tokens: int = 256
    temperature: float = 0.8  # 0 = greedy
    top_k: int = 200  # sample among the k most probable tokens; 0 = all
    top_p: float = 1.0  # ... and among the smallest set holding this probability; 1.0 = all
    seed: int = 1337  # prompt i samples from its own generator seeded seed + i
    stop: list[str] = field(default_factory=list)  # generation ends where one of these appears

    def __post_init__(self) -> None:
        lowest = {"beam_size": 1, "batch_size": 1, "streams": 0, "alpha": 0, "max_len_a": 0, "max_len_b": 0,
                  "max_new_tokens": 1, "temperature": 0, "top_k": 0, "seed": 0}  # fmt: skip
        for name, low in lowest.items():
            require_at_least(f"decode.{name}", getattr(self, name), low)
        require_one_of("decode.length_penalty", self.length_penalty, LENGTH_PENALTIES)
        require_one_of("decode.beam_stop", self.beam_stop, BEAM_STOPS)
        require_one_of("decode.precision", self.precision, INFERENCE_PRECISIONS)
        require_one_of("decode.steps", self.steps, DECODING_STEPS)
        if (
            not self.speculative.strip()
        ):  # (any other value names a draft checkpoint: loading.py's draft_model)
            raise ConfigError(
                "decode.speculative must be one of 'none', 'source', 'shallow' or a draft checkpoint's "
                f"folder; got {self.speculative!r}"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"decode.top_p must be in (0, 1]; got {self.top_p!r}")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ConfigError(f"decode.stop must be a list of non-empty strings; got {self.stop!r}")


@dataclass
class RunConfig:
    model: (
        TransformerConfig
        | DecoderModelConfig
        | EncoderModelConfig
        | RNNConfig
        | GlimpseConfig
        | WholeImageConfig
    ) = field(default_factory=TransformerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def __post_init__(self) -> None:
        task = task_record(self.data.task)
        if self.model.arch not in task.trains:
            fitting = ", ".join(sorted(tasks_training(self.model.arch)))
            raise ConfigError(
                f"data.task={task.name!r} trains a model.arch={' or '.join(map(repr, task.trains))} model, "
                f"not {self.model.arch!r} (model.arch={self.model.arch!r} does data.task {fitting})"
            )
        if task.head is not None and self.model.head != task.head:
            raise ConfigError(
                f"data.task={task.name!r} needs model.head={task.head!r}; got {self.model.head!r}"
            )
        if self.train.eval_metric not in task.metrics:
            raise ConfigError(
                f"train.eval_metric={self.train.eval_metric!r}: data.task={task.name!r} is judged by "
                f"one of {list(task.metrics)}"
            )
        if (
            isinstance(self.model, TransformerConfig)
            and self.model.positions == "learned"
            and self.model.max_len < self.data.max_len
        ):
            raise ConfigError(
                f"model.max_len ({self.model.max_len}) must be >= data.max_len ({self.data.max_len}): "
                "learned positions stop at model.max_len"
            )

    @classmethod
    def for_model(cls, model: Any) -> RunConfig:
        """The run configuration of an imported model (``model`` its model config): the first task its
        architecture and head do, judged by that task's first metric."""
        head = getattr(model, "head", None)
        for task in TASK_RECORDS.values():
            if model.arch in task.trains and task.head in (None, head):
                metric = task.default_metric
                return cls(
                    model=model, data=DataConfig(task=task.name), train=TrainConfig(eval_metric=metric)
                )
        raise ConfigError(
            f"a model.arch={model.arch!r} model with model.head={head!r} does no task by "
            "itself; fine-tune it with train.init_from"
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> RunConfig:
        """Build and check a run config; every error names ``source`` (the file) and the field."""
        try:
            return cls._from_dict(values)
        except ConfigError as error:
            raise ConfigError(f"{source}: {error}") from None

    @classmethod
    def _from_dict(cls, values: dict[str, Any]) -> RunConfig:
        sections = {"model", "data", "train", "decode"}
        unknown = sorted(set(values) - sections)
        if unknown:
            raise ConfigError(f"unknown section(s) {unknown}; known: {sorted(sections)}")
        model_values = dict(_mapping(values.get("model"), "model"))
        preset = model_values.pop("preset", None)
        default_arch = (
            PRESETS[preset].ARCH if preset in PRESETS else TransformerConfig.ARCH
        )  # from the preset
        model_class = config_class(model_values.get("arch", default_arch))
        checked = _checked(model_class, model_values, "model")
        model = model_class.from_preset(preset, **checked) if preset is not None else model_class(**checked)
        data, train = dict(_mapping(values.get("data"), "data")), dict(_mapping(values.get("train"), "train"))
        trains_on = tasks_training(model.arch)
        if len(trains_on) == 1:  # an architecture with one task (GPT's text, the images') defaults to it
            data.setdefault("task", trains_on[0])
        task = TASK_RECORDS.get(data.get("task", DataConfig.task))  # an unknown one: DataConfig reports it
        if task is not None:  # the task's own default metric, and an encoder's head unless set
            train.setdefault("eval_metric", task.default_metric)
            if task.head is not None and "head" not in model_values and isinstance(model, EncoderModelConfig):
                model.head = task.head
        return cls(
            model=model,
            data=DataConfig(**_checked(DataConfig, data, "data")),
            train=TrainConfig(**_checked(TrainConfig, train, "train")),
            decode=DecodeConfig(**_checked(DecodeConfig, _renamed(values.get("decode")), "decode")),
        )


def _renamed(decode: Any) -> Any:
    """The decode section with ``compile``, the name ``steps`` had while it was a yes or no, in its new
    name: ``true`` is ``steps: compiled``; ``false``, the default then, which every run wrote into its
    config.json, leaves ``steps`` at its default (``auto``). Given to a trained model on the command line,
    ``decode.compile=false`` is ``eager`` (:func:`with_decode_overrides`)."""
    if not isinstance(decode, dict) or "compile" not in decode:
        return decode
    decode = dict(decode)
    compiled = decode.pop("compile")
    if not isinstance(compiled, bool):
        raise ConfigError(f"'decode.compile' must be true or false (now decode.steps), got {compiled!r}")
    if compiled:
        decode["steps"] = "compiled"
    return decode


def _mapping(values: Any, section: str) -> dict[str, Any]:
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"section '{section}' must be a mapping, got {values!r}")
    return values


def _checked(cls: type, values: Any, section: str) -> dict[str, Any]:
    """``values`` if every key is a field of ``cls`` with a value of the field's type."""
    values = dict(_mapping(values, section))
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in values.items():
        if key not in fields:
            raise ConfigError(f"unknown field '{section}.{key}'; known: {sorted(fields)}")
        f = fields[key]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if isinstance(default, float) and isinstance(value, str):
            value = values[key] = _yaml_float(value)  # PyYAML reads "5e-4" (no dot) as a string
        expected = float if isinstance(default, float) else type(default)
        ok = isinstance(value, expected) and not (isinstance(value, bool) and expected is not bool)
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            raise ConfigError(f"'{section}.{key}' must be {expected.__name__}, got {value!r}")
    return {k: (float(v) if isinstance(fields[k].default, float) else v) for k, v in values.items()}


def _yaml_float(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text  # reported as a type error by the caller


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set ``section.field=value`` pairs (values parsed as YAML) on a nested dict."""
    values = {k: (dict(v) if isinstance(v, dict) else v) for k, v in values.items()}
    for item in overrides:
        key, sep, raw = item.partition("=")
        section, dot, name = key.strip().lstrip("-").partition(".")
        if not sep or not dot or not name:
            raise ConfigError(f"override {item!r} must look like section.field=value, e.g. train.lr=0.5")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise ConfigError(f"override {item!r}: cannot parse the value {raw!r}") from None
        target = values.setdefault(section, {})
        if target is None:
            target = values[section] = {}
        if not isinstance(target, dict):
            raise ConfigError(f"override {item!r}: section '{section}' is not a mapping")
        target[name] = value
    return values


def load_run_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML recipe (or start from defaults when ``path`` is None) and apply overrides."""
    values: dict[str, Any] = {}
    if path is None:
        source = "overrides" if overrides else "defaults"
    else:
        source = f"{path} + overrides" if overrides else str(path)
        try:
            values = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(f"{path}: cannot read the config ({error})") from None
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f":{mark.line + 1}" if mark else ""
            raise ConfigError(f"{path}{where}: not valid YAML ({getattr(error, 'problem', error)})") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: a config is a mapping of sections (model, data, train, decode)")
    return RunConfig.from_dict(apply_overrides(values, overrides or []), source)


def with_decode_overrides(decode: DecodeConfig, overrides: list[str]) -> DecodeConfig:
    """``decode`` changed by ``decode.field=value`` overrides, checked as a config file's are: how
    ``attnkit translate``, ``evaluate`` and ``generate`` decode a trained model with other settings (an
    α chosen on validation data, a larger batch) without editing its ``config.json``. Only the decode
    section can change after training."""
    values = apply_overrides({"decode": dataclasses.asdict(decode)}, overrides)
    other = sorted(set(values) - {"decode"})
    if other:
        raise ConfigError(f"'{other[0]}' settings are fixed by training; only decode.* ones can change here")
    if "compile" in values["decode"]:  # only an override names it: the name decode.steps had as a yes or no
        compiled = values["decode"].pop("compile")
        if not isinstance(compiled, bool):
            said = f"override decode.compile={compiled!r}: decode.compile is true or false (now decode.steps)"
            raise ConfigError(said)
        values["decode"]["steps"] = "compiled" if compiled else "eager"
    return DecodeConfig(**_checked(DecodeConfig, values["decode"], "decode"))


def without_precision(overrides: list[str]) -> list[str]:
    """The overrides other than ``decode.precision``: what a model that does not decode cannot take
    (every model takes a precision)."""
    return [override for override in overrides if not override.startswith("decode.precision=")]
