"""Fraction checkpoints: when one is due (`due_checkpoints`), and the atomic save and validated load of
`RUN/ckpt-XXXX/` directories.

A checkpoint directory (fraction x 10^4 in its name, e.g. ckpt-0625 = 6.25% of the budget) holds:
  discriminator.safetensors  `Electra.discriminator_state_dict()` (absent for objective "mlm")
  generator.safetensors      `Electra.generator_state_dict()`
  config.json                {"format": "tinyelectra-checkpoint", "format_version": 1, "recipe": {...},
                             "objective": ..., "checksums": "sha256.json"} (the marker: without it, written before
                             checksums existed)
  meta.json                  step, fraction, tokens_seen, train_flops_paper, train_flops_hardware, train_seconds (the
                             budget's clock; wall_seconds before issue 13), eval, ...
  tokenizer/                 written by `tinyelectra.tokenizer.Tokenizer.save()`
  sha256.json                the sha256 of the weights, config.json and meta.json, checked on load
                             (files.verify_sha256); its absence is damage where config.json says it was written, and
                             so is an entry missing for one of these files

And a run's exact-resume state, `RUN/state/step-N/` (model.safetensors, optimizer.pt read back with
`torch.load(weights_only=True)`, trainer.json: step, clocks, data cursor, plan, recipe, the checksums marker;
sha256.json), named by `RUN/state/LATEST`. Not here: transformers' formats (hf.py). Everything is written into
`NAME.tmp-<pid>`, fsynced, then renamed into place (files.staged_dir), so a crash never leaves half a checkpoint or a
LATEST pointing at an incomplete state; a file damaged afterwards is a one-line error naming it, never a silently
different model.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tinyelectra.budget import Plan, checkpoint_name  # noqa: F401  (checkpoint_name lives with the plan's schedule)
from tinyelectra.config import Recipe, recipe_from_dict
from tinyelectra.errors import UserError
from tinyelectra.files import (CHECKSUMS_KEY, SHA256_FILE, first_line, staged_dir, verify_sha256, write_atomic,
                              write_sha256, written_with_checksums)
from tinyelectra.tokenizer import Tokenizer

FORMAT = "tinyelectra-checkpoint"
FORMAT_VERSION = 1
CKPT_NAME = re.compile(r"^ckpt-(\d{4,5})$")  # ckpt-0625 ... ckpt-10000
# the files read back, each of which sha256.json must list (files.verify_sha256)
CHECKPOINT_FILES = ("discriminator.safetensors", "generator.safetensors", "config.json", "meta.json")
STATE_FILES = ("model.safetensors", "optimizer.pt", "trainer.json")

if TYPE_CHECKING:  # torch is imported where tensors are read or written: glue and report read meta.json without it
    import torch
    from torch import Tensor


def due_checkpoints(plan: Plan, step: int, done: set[str]) -> list[str]:
    """The fraction checkpoints to write after `step`: the next one once its step is reached (one per step, so a
    plan that shrank never writes two at once), and at the run's end whatever is left."""
    if plan.total_steps is None:
        return []
    pending = [n for n in plan.checkpoint_steps if n not in done]
    if step >= plan.total_steps:
        return pending
    return pending[:1] if pending and plan.checkpoint_steps[pending[0]] <= step else []


def is_checkpoint(path: Path) -> bool:
    """True if `path` is a directory whose config.json says it is a tinyelectra checkpoint."""
    try:
        return json.loads((Path(path) / "config.json").read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError, UnicodeDecodeError):
        return False


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """The fraction checkpoints inside a run directory, smallest fraction first."""
    found = [p for p in Path(run_dir).iterdir() if p.is_dir() and CKPT_NAME.match(p.name) and is_checkpoint(p)]
    return sorted(found, key=lambda p: int(CKPT_NAME.match(p.name).group(1)))  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------------- writing
def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def _save_tensors(tensors: dict[str, Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """A safetensors file, serialized in memory and written by Python: a full disk is then an OSError naming the
    file and its reason (safetensors' and torch's own writers report it without the errno)."""
    from safetensors.torch import save

    data = save({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, metadata=metadata)
    path.write_bytes(data)


def save_checkpoint(directory: Path, model, recipe: Recipe, meta: dict[str, Any], tokenizer_dir: Path | None,
                    written=None) -> Path:
    """Write `model` (an `Electra`) with its recipe, run metadata and tokenizer files, atomically. Returns the path.
    `written`: the record of the run folder (runfolder.Written), which lists the files and alone lets an older
    checkpoint of that name be replaced (files.replace_dir)."""
    directory = Path(directory)
    if model.objective != recipe.objective.kind:
        raise ValueError(f"model objective {model.objective!r} differs from the recipe's {recipe.objective.kind!r}")
    with staged_dir(directory, "checkpoint", written) as tmp:
        if model.discriminator is not None:
            _save_tensors(model.discriminator_state_dict(), tmp / "discriminator.safetensors", {"format": "pt"})
        _save_tensors(model.generator_state_dict(), tmp / "generator.safetensors", {"format": "pt"})
        _write_json(tmp / "config.json", {
            "format": FORMAT, "format_version": FORMAT_VERSION, "recipe": recipe.to_dict(),
            "objective": model.objective,
            CHECKSUMS_KEY: SHA256_FILE,
        })
        _write_json(tmp / "meta.json", meta)
        write_sha256(tmp)  # the weights, config and meta (a tokenizer may be replaced; its size is checked)
        if tokenizer_dir is not None:
            shutil.copytree(tokenizer_dir, tmp / "tokenizer")
    return directory


# ---------------------------------------------------------------------------------------------------- reading
def read_checkpoint_config(directory: Path) -> tuple[Recipe, str]:
    """Validate that `directory` is a tinyelectra checkpoint; return its recipe and objective (no weights read)."""
    d = Path(directory)
    if not d.exists():
        raise UserError(f"{d}: no such checkpoint directory")
    if not d.is_dir():
        raise UserError(f"{d}: not a directory (a checkpoint is a directory such as runs/NAME/ckpt-10000)")
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        inner = [p.name for p in d.iterdir() if p.is_dir() and CKPT_NAME.match(p.name)]
        if inner:
            raise UserError(f"{d}: a run directory, not one checkpoint; pick one of: {', '.join(sorted(inner))}")
        raise UserError(f"{d}: not a tinyelectra checkpoint (no config.json)")
    try:
        raw = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{cfg_path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        model_type = raw.get("model_type") if isinstance(raw, dict) else None
        if model_type == "electra":
            raise UserError(f"{d}: a transformers ELECTRA directory, not a tinyelectra checkpoint (load it with "
                            "tinyelectra.hf)")
        if model_type:
            raise UserError(f"{d}: config.json describes a {model_type!r} model, not a tinyelectra ELECTRA checkpoint")
        raise UserError(f"{d}: not a tinyelectra checkpoint (config.json has no \"format\": \"{FORMAT}\")")
    version = raw.get("format_version")
    if version != FORMAT_VERSION:
        raise UserError(f"{d}: checkpoint format_version {version!r}; this tinyelectra reads version {FORMAT_VERSION}")
    if not isinstance(raw.get("recipe"), dict):
        raise UserError(f"{cfg_path}: missing the \"recipe\" table")
    recipe = recipe_from_dict(raw["recipe"], where=f"{cfg_path} recipe")
    objective = raw.get("objective")
    if objective not in ("electra", "mlm"):
        raise UserError(f"{cfg_path}: objective {objective!r} is not ELECTRA's (\"electra\") or the MLM baseline "
                        "(\"mlm\")")
    if objective != recipe.objective.kind:
        raise UserError(f"{cfg_path}: objective {objective!r} disagrees with its recipe's objective.kind "
                        f"{recipe.objective.kind!r}")
    return recipe, objective


def read_weights(path: Path, vocab_size: int, word_key: str = "embeddings.word.weight") -> dict[str, Tensor]:
    """A checkpoint's safetensors file as CPU tensors, its word embeddings (`word_key` if there, else the shared
    embeddings') checked against `vocab_size`; missing, damaged or not ELECTRA's: one UserError."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise UserError(f"{path.parent}: checkpoint is missing {path.name}")
    try:
        tensors = load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(f"{path}: not a readable safetensors file ({str(e).splitlines()[0][:200]})") from None
    key = word_key if word_key in tensors else "embeddings.word.weight"
    if key not in tensors:
        raise UserError(f"{path}: no {key} tensor: not an ELECTRA checkpoint file")
    check_vocab_rows(tensors[key].shape[0], vocab_size, path)
    return tensors


def check_vocab_rows(rows: int, vocab_size: int, where: Path) -> None:
    """The word-embedding rows in the weights must equal the vocabulary size in the config (the one check, for our
    checkpoints and transformers' directories alike; the tokenizer's side is `check_tokenizer`)."""
    if rows != vocab_size:
        raise UserError(f"{where}: vocabulary size mismatch: weights have {rows} word embeddings, config says "
                        f"vocab_size {vocab_size}")


def check_tokenizer(tokenizer_dir: Path, vocab_size: int) -> None:
    """The tokenizer saved beside the weights must have exactly the model's vocabulary size."""
    tok = Tokenizer.load(tokenizer_dir)
    if tok.vocab_size != vocab_size:
        raise UserError(f"{tokenizer_dir}: vocabulary size mismatch: tokenizer has {tok.vocab_size} tokens, "
                        f"the model {vocab_size}")


def train_seconds_of(meta: dict) -> float | None:
    """The training seconds a checkpoint's meta (or its metrics.jsonl event) records: `train_seconds`, called
    `wall_seconds` by checkpoints written before issue 13's rename (it was always training time, not wall time)."""
    return meta.get("train_seconds", meta.get("wall_seconds"))


def read_meta(directory: Path) -> dict[str, Any]:
    """A checkpoint's meta.json, with the training seconds under `train_seconds` whichever name it was written with.
    Missing or unreadable: one UserError."""
    path = Path(directory) / "meta.json"
    if not path.is_file():
        raise UserError(f"{directory}: checkpoint is missing meta.json")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise UserError(f"{path}: cannot be read ({e.strerror or e})") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise UserError(f"{path}: not a JSON object")
    if "train_seconds" not in meta and "wall_seconds" in meta:
        meta["train_seconds"] = meta.pop("wall_seconds")
    return meta


def verify_checkpoint(directory: Path) -> None:
    """A checkpoint's files against its sha256.json (required where its config.json says one was written)."""
    verify_sha256(directory, "the checkpoint", required=written_with_checksums(Path(directory) / "config.json"),
                  # not the tokenizer: it may be replaced (its size is checked, check_tokenizer)
                  guards=CHECKPOINT_FILES)


def load_checkpoint(directory: Path):
    """Read a checkpoint back: (Electra in eval mode on the CPU, Recipe, meta dict). Every problem is one UserError."""
    from tinyelectra.model import Electra

    d = Path(directory)
    recipe, objective = read_checkpoint_config(d)
    verify_checkpoint(d)
    meta = read_meta(d)
    vocab = recipe.model.vocab_size
    disc = read_weights(d / "discriminator.safetensors", vocab) if objective == "electra" else None
    gen = read_weights(d / "generator.safetensors", vocab, "gen_embeddings.word.weight")
    if (d / "tokenizer").is_dir():
        check_tokenizer(d / "tokenizer", vocab)
    model = Electra(recipe.model, objective=objective)
    try:
        model.load_split_state_dict(disc, gen)
    except RuntimeError as e:
        detail = " ".join(line.strip() for line in str(e).strip().splitlines()[:3])[:400]
        raise UserError(f"{d}: weights do not fit the checkpoint's recipe ({detail})") from None
    model.eval()
    return model, recipe, meta


# ---------------------------------------------------------------------------------------------------- resume state
RESUME_FORMAT = 1


def save_resume_state(run_dir: Path, model, optimizer, scaler, loader, written=None, **info) -> Path:
    """Write state/step-N/ completely (with its sha256.json), then point state/LATEST at it (atomic rename), then drop
    older states: with the run folder's record `written` (runfolder.Written), what it lists of them, each file on
    record before it is written; without, the older states whole. An error or interrupt part-way leaves the previous
    state as it was. Returns the state's directory."""
    import torch

    root = run_dir / "state"
    name = f"step-{info['step']:09d}"
    if written is not None:
        written.add(root, kind="dir")
        written.add(root / "LATEST")
    with staged_dir(root / name, "resume state", written) as tmp:
        _save_tensors(model.state_dict(), tmp / "model.safetensors")
        buffer = io.BytesIO()  # through memory, as `_save_tensors`
        torch.save({"optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                    "torch_rng": torch.get_rng_state()}, buffer)
        (tmp / "optimizer.pt").write_bytes(buffer.getbuffer())
        _write_json(tmp / "trainer.json", {"format": RESUME_FORMAT, "loader": loader.state_dict(), **info,
                                           "recipe": info["recipe"].to_dict(), CHECKSUMS_KEY: SHA256_FILE})
        write_sha256(tmp)
    write_atomic(root / "LATEST", name + "\n", "resume state pointer")
    for old in root.iterdir():
        if old.name not in (name, "LATEST"):
            if written is not None:
                written.delete(under=old)
            else:
                shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)
    return root / name


def latest_state(run_dir: Path) -> Path | None:
    """The newest complete resume state of a run (state/LATEST names it), or None when the run has none."""
    latest = Path(run_dir) / "state" / "LATEST"
    if not latest.is_file():
        return None
    try:
        name = latest.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        raise UserError(f"{latest}: damaged (unreadable)") from None
    if not re.fullmatch(r"step-\d{9}", name):
        raise UserError(f"{latest}: damaged (names {name[:40]!r}, not a state directory)")
    return latest.parent / name


def read_state_info(d: Path) -> dict:
    """trainer.json of the resume state `d` (its files checked against sha256.json first)."""
    if not d.is_dir():
        raise UserError(f"{d}: the resume state named by {d.parent / 'LATEST'} is missing")
    verify_sha256(d, "the resume state", required=written_with_checksums(d / "trainer.json"), guards=STATE_FILES)
    path = d / "trainer.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: missing; the resume state is incomplete") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: damaged (not valid JSON: {str(e)[:120]})") from None
    if not isinstance(meta, dict) or meta.get("format") != RESUME_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise UserError(f"{path}: state format {found!r}, this tinyelectra reads {RESUME_FORMAT}")
    missing = [k for k in ("step", "tokens_seen", "train_seconds", "other_seconds", "checkpoints", "loader", "recipe")
               if k not in meta]
    if missing:
        raise UserError(f"{path}: damaged (no {', '.join(missing)})")
    return meta


def load_resume_state(d: Path, meta: dict, model, optimizer, scaler, loader, device: torch.device) -> None:
    """Load the resume state in `d` into the model, optimizer, scaler and data loader; `meta` is its trainer.json as
    `read_state_info` returned it (which checked the files read here against sha256.json)."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    weights = d / "model.safetensors"
    try:
        model.load_state_dict(load_file(str(weights), device=str(device)))
    except FileNotFoundError:
        raise UserError(f"{weights}: missing; the resume state is incomplete") from None
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise UserError(f"{weights}: damaged or not this recipe's weights ({first_line(e)})") from None
    extra_path = d / "optimizer.pt"
    try:
        extra = torch.load(extra_path, map_location=device, weights_only=True)
        optimizer.load_state_dict(extra["optimizer"])
        scaler.load_state_dict(extra["scaler"])
        torch.set_rng_state(extra["torch_rng"].cpu())
    except FileNotFoundError:
        raise UserError(f"{extra_path}: missing; the resume state is incomplete") from None
    except (pickle.UnpicklingError, EOFError, RuntimeError, ValueError, KeyError, TypeError, AttributeError, OSError):
        # not torch's own message: it advises weights_only=False, which would run whatever the file holds
        raise UserError(f"{extra_path}: damaged (not a readable optimizer state written by tinyelectra)") from None
    loader.load_state_dict(meta["loader"])
