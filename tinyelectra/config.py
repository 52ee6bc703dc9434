"""Configuration as data: one frozen dataclass per concern, recipes read from TOML, `--set` overrides.

A recipe file (recipes/*.toml) has top-level `name`, `description`, `deviations` (every way it departs
from the paper, each with its reason) and one table per section below. Unknown keys and wrong types are
errors that name the field. Derived numbers (the generator's size, tokens per step) are computed here once.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import typing
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from tinyelectra.errors import UserError


def _check(cond: bool, where: str, msg: str) -> None:
    if not cond:
        raise UserError(f"{where}: {msg}")


@dataclass(frozen=True)
class ModelConfig:
    """The discriminator's shape; the generator is derived from it (paper §3.2 and Appendix A)."""

    vocab_size: int = 30522
    embedding_size: int = 128  # E: token/position/type embedding width, projected to H when E != H
    hidden_size: int = 256  # H
    num_layers: int = 12
    num_heads: int = 4
    ffn_size: int = 1024
    max_positions: int = 512
    type_vocab_size: int = 2
    dropout: float = 0.1  # hidden dropout
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    generator_fraction: float = 0.25  # generator hidden = this x H (FFN 4x it, heads = hidden // 64: official rule)
    sharing: str = "embeddings"  # embeddings (paper) | all (generator == discriminator encoder) | none

    def __post_init__(self) -> None:
        for name in ("vocab_size", "embedding_size", "hidden_size", "num_layers", "num_heads", "ffn_size",
                     "max_positions"):
            _check(getattr(self, name) > 0, f"model.{name}", "must be positive")
        _check(self.type_vocab_size >= 2, "model.type_vocab_size", "must be >= 2 (segments A and B have ids 0 and 1)")
        _check(0.0 < self.layer_norm_eps < 1.0, "model.layer_norm_eps", "must be in (0, 1)")
        _check(self.hidden_size % self.num_heads == 0, "model.hidden_size", "must be divisible by num_heads")
        _check(0.0 <= self.dropout < 1.0, "model.dropout", "must be in [0, 1)")
        _check(0.0 <= self.attention_dropout < 1.0, "model.attention_dropout", "must be in [0, 1)")
        _check(0.0 < self.generator_fraction <= 1.0, "model.generator_fraction", "must be in (0, 1]")
        _check(self.sharing in ("embeddings", "all", "none"), "model.sharing", "must be embeddings, all or none")
        _check(self.sharing != "all" or self.generator_fraction == 1.0, "model.sharing",
               "'all' ties every generator weight to the discriminator, which needs a same-size generator "
               f"(generator_fraction = 1.0), not {self.generator_fraction}")
        if self.generator_fraction < 1.0:  # the generator's shape, derived (`generator`), checked as the generator's
            hidden = self._generator_hidden()
            heads = max(1, hidden // 64)
            _check(hidden % heads == 0, "model.generator_fraction",
                   f"gives a generator of hidden size {hidden} (round({self.hidden_size} x "
                   f"{self.generator_fraction:g})) with {heads} heads (hidden // 64, the official rule), which do not "
                   "divide it; choose a model.hidden_size or model.generator_fraction whose generator size is a "
                   "multiple of its heads")

    def _generator_hidden(self) -> int:
        return max(1, int(round(self.hidden_size * self.generator_fraction)))

    def generator(self) -> "ModelConfig":
        """The generator's shape, by the official code's rule (run_pretraining.get_generator_config): hidden =
        round(fraction x H), FFN = 4 x that hidden, heads = max(1, hidden // 64), same depth. Its embeddings are the
        discriminator's (width E, projected to its hidden size) unless sharing = "none": then it has its own
        embeddings at its hidden width, without a projection (the official untied generator)."""
        if self.generator_fraction == 1.0:
            return self
        hidden = self._generator_hidden()
        return dataclasses.replace(
            self, hidden_size=hidden, ffn_size=4 * hidden, num_heads=max(1, hidden // 64),
            embedding_size=hidden if self.sharing == "none" else self.embedding_size,
            generator_fraction=1.0, sharing="embeddings",
        )


@dataclass(frozen=True)
class ObjectiveConfig:
    """What is learned: ELECTRA's replaced-token detection, or BERT's masked LM as the baseline."""

    kind: str = "electra"  # electra | mlm
    mask_prob: float = 0.15  # share of positions chosen; fixed N = int((mask_prob + 0.005) * seq_len) slots
    mask_token_fraction: float = 0.85  # of the chosen: replaced by [MASK] (ELECTRA 0.85; BERT 0.8)
    random_token_fraction: float = 0.0  # of the chosen: replaced by a random token (ELECTRA 0; BERT 0.1)
    disc_weight: float = 50.0  # lambda: loss = MLM + lambda * RTD
    temperature: float = 1.0  # generator sampling temperature

    def __post_init__(self) -> None:
        _check(self.kind in ("electra", "mlm"), "objective.kind", "must be electra or mlm")
        _check(0.0 < self.mask_prob < 1.0, "objective.mask_prob", "must be in (0, 1)")
        _check(self.mask_token_fraction >= 0 and self.random_token_fraction >= 0
               and self.mask_token_fraction + self.random_token_fraction <= 1.0,
               "objective.mask_token_fraction", "mask_token_fraction + random_token_fraction must be within [0, 1]")
        _check(self.disc_weight >= 0, "objective.disc_weight", "must be >= 0")
        _check(self.temperature > 0, "objective.temperature", "must be > 0")

    def num_masked(self, seq_len: int) -> int:
        """N, the fixed number of prediction slots per row (static shapes): int((p + 0.005) * T)."""
        return int((self.mask_prob + 0.005) * seq_len)


@dataclass(frozen=True)
class OptimConfig:
    name: str = "adam"  # adam (paper: no bias correction) | adamw (torch, bias-corrected) | adamw8bit (bitsandbytes)
    lr: float = 5e-4  # peak learning rate
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-6
    weight_decay: float = 0.01  # decoupled; never on LayerNorm weights or biases
    clip_norm: float = 1.0  # global gradient norm; 0 disables
    warmup_steps: int = 10_000  # of the full schedule; not scaled with the budget: a shorter run keeps it, capped at
    # 10% of the run and, with the paper's Adam, raised to min(1 / (1 - beta2), half the run) steps (budget.warmup_for)

    def __post_init__(self) -> None:
        _check(self.name in ("adam", "adamw", "adamw8bit"), "optim.name", "must be adam, adamw or adamw8bit")
        _check(self.lr > 0, "optim.lr", "must be > 0")
        _check(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "optim.beta1", "betas must be in [0, 1)")
        _check(self.eps > 0, "optim.eps", "must be > 0")
        for name in ("weight_decay", "clip_norm", "warmup_steps"):
            _check(getattr(self, name) >= 0, f"optim.{name}", "must be >= 0")


@dataclass(frozen=True)
class TrainConfig:
    batch_size: int = 128  # global sequences per optimizer step
    seq_len: int = 128  # tokens per sequence
    steps: int = 1_000_000  # the recipe's full schedule (what `--budget paper` runs)
    micro_batch_size: int = 0  # sequences per forward/backward; 0 = whole batch (GPU: fitted automatically)
    grad_checkpointing: bool = False
    precision: str = "auto"  # auto (bf16 if supported, else fp16 on CUDA, fp32 on CPU) | bf16 | fp16 | fp32
    # auto (CUDA only) | on | off | reduce-overhead (inductor + CUDA graphs, one process, one micro-batch)
    compile: str = "auto"
    # | regional (each repeated block compiled once, the rest eager) | regional-graph (regional + the whole step as one
    # CUDA graph; needs update = flat): opt-in, runtime.choose_compile
    update: str = "per-tensor"  # per-tensor (torch's fused AdamW per tensor; compiled under CUDA graphs) | flat (flat
    # buffers, one norm, one fused pass, out of inductor: optim.FlatUpdate). Opt-in; the same mathematics
    strategy: str = "ddp"  # ddp (also single process) | deepspeed (ZeRO-2)
    deepspeed_offload: bool = False  # ZeRO-2 optimizer state on the CPU
    seed: int = 0
    log_every_steps: int = 50
    resume_every_seconds: float = 300.0  # full resume state at most this far apart
    deterministic: bool = False  # torch deterministic algorithms (exact-resume tests)
    eval_rows: int = 512  # held-out rows scored at each fraction checkpoint
    # Kernel variants (issue 33), each the same mathematics as its default; the defaults stay today's until a card's
    # A/B run shows a win. sampler: how the generator's replacements are drawn (electra.sample_tokens): auto
    # (inverse CDF on the CPU, Gumbel-max on a GPU) | inverse-cdf (one random number per masked slot) | gumbel-max
    sampler: str = "auto"
    # attention: how padded batches reach attention (model.Encoder): mask (a boolean padding mask to SDPA, which rules
    # out FlashAttention) | varlen (the rows' lengths: FlashAttention's variable-length kernel, Ampere+ GPUs in
    # bf16/fp16)
    attention: str = "mask"
    # weight_copy: what a bf16/fp16 forward's matmuls read (runtime.WeightCopies): cast (autocast casts each fp32
    # weight at every use) | copy (a low-precision copy of the weights, refreshed once per step after the update; the
    # same arithmetic). No effect in fp32
    weight_copy: str = "cast"

    def __post_init__(self) -> None:
        for name in ("batch_size", "steps", "log_every_steps", "resume_every_seconds"):
            _check(getattr(self, name) > 0, f"train.{name}", "must be > 0")
        _check(8 <= self.seq_len <= 512, "train.seq_len", "must be between 8 and 512")
        for name in ("micro_batch_size", "eval_rows", "seed"):
            _check(getattr(self, name) >= 0, f"train.{name}", "must be >= 0")
        _check(self.precision in ("auto", "bf16", "fp16", "fp32"), "train.precision",
               "must be auto, bf16, fp16 or fp32")
        _check(self.compile in ("auto", "on", "off", "reduce-overhead", "regional", "regional-graph"), "train.compile",
               "must be auto, on, off, reduce-overhead, regional or regional-graph")
        _check(self.update in ("per-tensor", "flat"), "train.update", "must be per-tensor or flat")
        _check(self.compile != "regional-graph" or self.update == "flat", "train.compile",
               "regional-graph captures the flat update: add --set train.update=flat")
        _check(self.strategy in ("ddp", "deepspeed"), "train.strategy", "must be ddp or deepspeed")
        _check(self.sampler in ("auto", "inverse-cdf", "gumbel-max"), "train.sampler",
               "must be auto, inverse-cdf or gumbel-max")
        _check(self.attention in ("mask", "varlen"), "train.attention", "must be mask or varlen")
        _check(self.weight_copy in ("cast", "copy"), "train.weight_copy",
               f"must be cast or copy, not {self.weight_copy!r}")
        _check(self.weight_copy == "cast" or self.strategy == "ddp", "train.weight_copy",
               "copy is for train.strategy=ddp (DeepSpeed's engine keeps its own low-precision weights)")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len


# How the steps are computed, not what they compute: `train --resume --set` may change these at any step, recorded as
# runtime changes (still the recipe's run). The micro-batch is accumulated to the same global batch (the same loss and
# gradients up to float summation order; but each micro-batch's masks, samples and dropout are drawn from its own
# seed, so a changed micro-batch draws others from there on, as a card that fits another one would: a tiny run's
# losses moved by up to 0.3%); gradient checkpointing recomputes activations with the same draws; compile and
# deterministic choose the kernels (compiled dropout draws its masks its own way), and so does update (per tensor or
# flat: the same resume-state format, the same mathematics, float rounding apart); sampler draws the generator's
# replacements from the same distribution another way; attention gives every real token what the mask gives it;
# weight_copy reads the weights' low-precision copies instead of casting them (bit for bit the same numbers);
# resume_every_seconds how often a resume state is written. Not these: precision (other arithmetic, and fp16's loss
# scale is in the resume state), strategy and deepspeed_offload (another optimizer-state format, which --resume cannot
# read), seed (the run's randomness), log_every_steps (metrics.jsonl's loss windows keep one length through a run; DDP
# re-plans a time budget at log steps) and eval_rows (the checkpoints' held-out scores would no longer compare).
RUNTIME_SETTINGS = ("train.micro_batch_size", "train.grad_checkpointing", "train.compile", "train.update",
                    "train.deterministic", "train.resume_every_seconds", "train.sampler", "train.attention",
                    "train.weight_copy")


@dataclass(frozen=True)
class DataConfig:
    """How `train --corpus` (and the built-in corpus) are prepared; `tinyelectra prepare` has the full set of
    options."""

    tokenizer: str = ""  # a vocab.txt / tokenizer.json / SentencePiece .model; empty = train a WordPiece
    # auto: uncased (the paper's) for English-like text, cased where uncased normalisation would strip accents, kana
    # voicing marks or Hangul syllables (tokenizer.choose_casing) | uncased | cased
    casing: str = "auto"
    validation_fraction: float = 0.01  # share of documents held out for validation

    def __post_init__(self) -> None:
        _check(self.casing in ("auto", "uncased", "cased"), "data.casing", "must be auto, uncased or cased")
        _check(0.0 <= self.validation_fraction < 0.5, "data.validation_fraction", "must be in [0, 0.5)")


SECTIONS: dict[str, type] = {"model": ModelConfig, "objective": ObjectiveConfig, "optim": OptimConfig,
                             "train": TrainConfig, "data": DataConfig}


@dataclass(frozen=True)
class Recipe:
    name: str = "custom"
    description: str = ""
    deviations: tuple[str, ...] = ()  # every departure from the paper, with its reason
    model: ModelConfig = field(default_factory=ModelConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"deviations": list(self.deviations)}

    def with_overrides(self, assignments: list[str]) -> "Recipe":
        """Apply `section.key=value` strings (`parse_assignment`), each parsed to the field's type."""
        raw = self.to_dict()
        for a in assignments:
            section, name, value = parse_assignment(a, SECTIONS)
            raw[section][name] = value
        return recipe_from_dict(raw, where="--set")


def parse_assignment(text: str, sections: dict[str, type], default_section: str | None = None) -> tuple[str, str, Any]:
    """One `--set` for every command: `section.key=value` -> (section, key, value parsed to the field's type).
    Training's sections are a recipe's ([model], [optim], ...); fine-tuning's one is [finetune] (`default_section`,
    so a bare `key=value` means finetune.key)."""
    if "=" not in text:
        raise UserError(f"--set {text!r}: expected section.key=value")
    key, value = (part.strip() for part in text.split("=", 1))
    if "." in key:
        section, name = key.split(".", 1)
    elif default_section is not None:
        section, name = default_section, key
    else:
        raise UserError(f"--set {text!r}: expected section.key=value (sections: {', '.join(sections)})")
    if section not in sections:
        raise UserError(f"--set {key}: unknown section {section!r} (sections: {', '.join(sections)})")
    fields = [f.name for f in dataclasses.fields(sections[section])]
    if name not in fields:
        raise UserError(f"--set {key}: unknown key {name!r} in [{section}] (keys: {', '.join(fields)})")
    return section, name, _parse_scalar(value, typing.get_type_hints(sections[section])[name], f"--set {key}")


_BOOLS = {**dict.fromkeys(("1", "true", "yes", "on"), True), **dict.fromkeys(("0", "false", "no", "off"), False)}


def _parse_scalar(text: str, typ: type, where: str) -> Any:
    try:
        if typ is bool:
            return _BOOLS[text.lower()]
        if typ is float:
            value: Any = float(text)
        elif typ is int:
            try:
                value = int(text.replace("_", ""))
            except ValueError:
                value = float(text)  # 1e6 is a whole number; 1e400 is infinity, refused by _coerce
                if math.isfinite(value):
                    if value != int(value):
                        raise
                    value = int(value)
        else:
            return text
    except (KeyError, ValueError):
        raise UserError(f"{where}: {text!r} is not a valid {typ.__name__}") from None
    return _coerce(value, typ, where, shown=repr(text))


INT_LIMIT = 2**63  # an int setting must fit torch's and numpy's int64 (steps, sizes and seeds become tensors or arrays)


def _coerce(value: Any, typ: type, where: str, shown: str = "") -> Any:
    """Type-check a value (from TOML or `--set`, written as `shown`) against a dataclass field type (ints are
    accepted for floats): a number must be finite (TOML and `--set` both spell inf and nan, and 1e400 is infinity)
    and an int must fit int64."""
    shown = shown or repr(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{where}: {shown} is not a finite number")
    if (typ in (int, float) and isinstance(value, int) and not isinstance(value, bool)
            and not -INT_LIMIT < value < INT_LIMIT):
        raise UserError(f"{where}: {shown} is out of range (at most {INT_LIMIT - 1:.3e})")
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):  # bool is a subclass of int
        raise UserError(f"{where}: expected {typ.__name__}, got {type(value).__name__} {value!r}")
    return value


def section_values(cls: type, values: Any, where: str) -> dict[str, Any]:
    """A TOML table's values for dataclass `cls`, each checked against its field's type; unknown keys are errors."""
    if not isinstance(values, dict):
        raise UserError(f"{where}: expected a table")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    for key in (k for k in values if k not in known):
        raise UserError(f"{where}.{key}: unknown key (known: {', '.join(sorted(known))})")
    return {k: _coerce(v, hints[k], f"{where}.{k}") for k, v in values.items()}


def recipe_from_dict(raw: dict[str, Any], where: str = "recipe") -> Recipe:
    data = raw.get("data")
    if isinstance(data, dict) and isinstance(data.get("lowercase"), bool) and "casing" not in data:
        # recipes and checkpoints written before data.casing existed said data.lowercase = true | false
        raw = {**raw, "data": {**{k: v for k, v in data.items() if k != "lowercase"},
                               "casing": "uncased" if data["lowercase"] else "cased"}}
    optim = raw.get("optim")
    if isinstance(optim, dict) and optim.get("disc_lr_scale") == 1.0:
        # recipes and checkpoints written while optim.disc_lr_scale existed say 1 (the paper's one rate; the knob was
        # deleted when it measured no help); any other value stays an unknown key: that run cannot be reproduced
        raw = {**raw, "optim": {k: v for k, v in optim.items() if k != "disc_lr_scale"}}
    known_top = {"name", "description", "deviations", "finetune", *SECTIONS}  # [finetune]: `tinyelectra glue --config`
    for key in (k for k in raw if k not in known_top):
        raise UserError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(known_top))})")
    deviations = raw.get("deviations", [])
    if not isinstance(deviations, (list, tuple)) or not all(isinstance(d, str) for d in deviations):
        raise UserError(f"{where}.deviations: expected a list of strings")
    name = raw.get("name", "custom")
    if not isinstance(name, str):
        raise UserError(f"{where}.name: expected a string")
    sections = {s: cls(**section_values(cls, raw.get(s, {}), f"{where}: [{s}]")) for s, cls in SECTIONS.items()}
    recipe = Recipe(name=name, description=str(raw.get("description", "")), deviations=tuple(deviations), **sections)
    if recipe.train.seq_len > recipe.model.max_positions:
        raise UserError(f"{where}: train.seq_len {recipe.train.seq_len} exceeds model.max_positions "
                        f"{recipe.model.max_positions}")
    if recipe.objective.num_masked(recipe.train.seq_len) < 1:
        raise UserError(f"{where}: objective.mask_prob {recipe.objective.mask_prob:g} chooses no position of "
                        f"train.seq_len {recipe.train.seq_len} tokens (int((mask_prob + 0.005) x seq_len) = 0)")
    return recipe


def differences(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Where two JSON-like values (recipes, prepare requests) differ: (key, value in `a`, value in `b`) for each
    differing leaf, keys dotted ("optim.lr") and list items indexed ("inputs[3].size_bytes")."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b))
                for d in differences(a.get(k), b.get(k), f"{path}.{k}" if path else k)]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [(path, a, b)]


def difference_text(difference: tuple[str, Any, Any], width: int = 80) -> str:
    """"key: A there, B now", each value's repr cut at `width` characters."""
    key, there, now = difference
    shown = [r if len(r := repr(v)) <= width else r[:width] + "..." for v in (there, now)]
    return f"{key}: {shown[0]} there, {shown[1]} now"


def checkout_recipes() -> Path | None:
    """recipes/ of the checkout this package is imported from (tinyelectra/ beside recipes/ and a pyproject.toml that
    names the project), or None for an installed copy. A plain checkout that is not installed (`PYTHONPATH=.`,
    `python -m tinyelectra` in the repository) has no `tinyelectra.recipes` package: the folder is its one source."""
    root = Path(__file__).resolve().parent.parent
    folder = root / "recipes"
    project = root / "pyproject.toml"
    try:
        names_us = project.is_file() and 'name = "tinyelectra"' in project.read_text(encoding="utf-8")
    except OSError:
        names_us = False
    return folder if names_us and folder.is_dir() else None


def recipe_files() -> dict[str, Any]:
    """The shipped recipes by name: recipes/*.toml of the checkout when the package runs from one (installed
    editable or not at all), else the package data of `tinyelectra.recipes`, found through importlib.resources in a
    wheel and `pip install .`."""
    folder = checkout_recipes()
    candidates = folder.iterdir() if folder is not None else files("tinyelectra.recipes").iterdir()
    found = {p.name[: -len(".toml")]: p for p in candidates if p.name.endswith(".toml")}
    return dict(sorted(found.items()))


def load_recipe(name_or_path: str, overrides: list[str] | None = None) -> Recipe:
    """Load a shipped recipe by name (or a .toml path), then apply `--set` overrides."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise UserError(f"recipe file not found: {path}")
    else:
        shipped = recipe_files()
        if name_or_path not in shipped:
            raise UserError(f"unknown recipe {name_or_path!r} (available: {', '.join(shipped) or 'none'})")
        path = shipped[name_or_path]  # a Traversable in the package data
    return recipe_from_dict(read_toml(path), where=str(path)).with_overrides(overrides or [])


def read_toml(path: Path, label: str = "") -> dict[str, Any]:
    """A TOML file (recipe, [finetune] settings, custom task) as a dict; unreadable or invalid: one UserError, its
    message starting with `label` (e.g. "--task-file ") and the path."""
    where = f"{label}{path}"
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{where}: not valid TOML ({e})") from None
    except UnicodeDecodeError:
        raise UserError(f"{where}: not a text file (TOML is UTF-8)") from None
    except OSError as e:
        raise UserError(f"{where}: cannot be read ({e.strerror or e})") from None


def recipe_toml(recipe: Recipe) -> str:
    """The recipe as TOML that `--recipe FILE` reads back to the same recipe (`tinyelectra recipe NAME`)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, (list, tuple)):
            return "[\n" + "".join(f"    {value(x)},\n" for x in v) + "]"
        return json.dumps(str(v), ensure_ascii=False)  # a TOML basic string is a JSON string

    raw = recipe.to_dict()
    lines = [f"{key} = {value(raw[key])}" for key in ("name", "description", "deviations")]
    for section in SECTIONS:
        lines += ["", f"[{section}]"] + [f"{k} = {value(v)}" for k, v in raw[section].items()]
    return "\n".join(lines) + "\n"


def _first_clause(text: str) -> str:
    """A description up to its first ": " or ". " outside parentheses ("(Clark et al. 2020, ...)" stays whole)."""
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and text[i:i + 2] in (": ", ". "):
            return text[:i]
    return text.rstrip(".")


def recipe_command(name: str | None, overrides: list[str]) -> None:
    """`tinyelectra recipe [NAME] [--set ...]`: print the resolved recipe as TOML, or list the shipped recipes."""
    if name is None:
        for shipped, path in recipe_files().items():
            print(f"{shipped:20} "
                  f"{_first_clause(str(tomllib.loads(path.read_text(encoding='utf-8')).get('description', '')))}")
        return
    print(recipe_toml(load_recipe(name, overrides)), end="")
