"""The command line: parses arguments, then calls one function per command. No logic lives here.

Heavy imports (torch, transformers) happen inside the commands so that `--help` is instant.
Bad input raises `UserError`; `main()` prints it as one line on stderr and exits with code 2, as it does click's
usage errors (a missing or unknown option, a value of the wrong type), which would print a usage block.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Optional

import typer

from tinyelectra.errors import UserError
from tinyelectra.tokenizer import CHARACTER_COVERAGE  # stdlib imports only: --help stays instant

try:  # the exceptions of the click that typer runs on: its own copy (typer 0.2x), or click itself (earlier typer)
    from typer._click import exceptions as click_errors
except ImportError:
    from click import exceptions as click_errors
HELP_FOR_NO_ARGS = getattr(click_errors, "NoArgsIsHelpError", ())  # `tinyelectra` alone (click < 8.2 prints it itself)

app = typer.Typer(
    name="tinyelectra",  # the help text is _main's docstring
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,  # plain click help: rich's option table cuts long option names at 80 columns
)


def _command_line() -> str:
    return "tinyelectra " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _print_version(value: bool) -> None:
    if value:
        from tinyelectra import __version__

        print(f"tinyelectra {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Pre-train ELECTRA within a budget on one GPU (or a CPU), then see what each slice of it buys on GLUE."""


@app.command()
def prepare(
    corpus: list[str] = typer.Option(
        ..., "--corpus", metavar="SOURCE", help="Text sources: files, folders, globs, .gz/.bz2/.xz, .jsonl (text "
        "field), .parquet, WikiExtractor output, hf:NAME[:CONFIG], or 'builtin' (offline smoke-test corpus). Repeat "
        "or list several."
    ),
    out: Path = typer.Option(..., "--out", metavar="DIR",
                             help="Output data directory (shards, tokenizer, manifest.json)."),
    tokenizer: Optional[str] = typer.Option(
        None, "--tokenizer", metavar="FILE",
        help="Use this vocab.txt, tokenizer.json or SentencePiece .model instead of training one."
    ),
    tokenizer_type: str = typer.Option(
        "wordpiece", "--tokenizer-type", metavar="wordpiece|sentencepiece", help="Train a 'wordpiece' (BERT's) or a "
        "'sentencepiece' model ([PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4; text kept as written, runs of spaces "
        "included, so decode returns it)."
    ),
    vocab_size: int = typer.Option(30522, "--vocab-size", metavar="N", help="Size of the vocabulary to train."),
    seq_len: int = typer.Option(128, "--seq-len", metavar="N", help="Tokens per example, 8 to 512."),
    casing: str = typer.Option(
        "auto", "--casing", metavar="auto|uncased|cased", help="WordPiece normalisation: 'uncased' (lower-case and "
        "strip accents, as the paper), 'cased', or 'auto': uncased only for English-like text, cased when uncased "
        "would strip accents, kana voicing marks or Hangul syllables. The choice and its reason go into manifest.json."
    ),
    character_coverage: float = typer.Option(
        CHARACTER_COVERAGE, "--character-coverage", metavar="SHARE", help="Share of character occurrences the "
        "WordPiece alphabet (at least 1,000 characters when present, at most a third of the vocabulary) or the "
        "SentencePiece model covers; rarer characters become [UNK] (or byte pieces)."
    ),
    sentencepiece_model: str = typer.Option("unigram", "--sentencepiece-model", metavar="unigram|bpe",
                                            help="'unigram' or 'bpe' (with --tokenizer-type sentencepiece)."),
    byte_fallback: bool = typer.Option(
        True, "--byte-fallback/--no-byte-fallback",
        help="SentencePiece: spell characters outside the model as UTF-8 byte pieces instead of [UNK]."
    ),
    pack_documents: bool = typer.Option(
        False, "--pack-documents", help="Let short documents share examples (for text of short paragraphs or records, "
        "where one padded example per document would be mostly padding; prepare reports the fill ratio)."
    ),
    workers: int = typer.Option(0, "--workers", metavar="N", help="Tokenization processes (0 = one per CPU core)."),
    force: bool = typer.Option(False, "--force", help="Replace the dataset in an output directory that holds a "
                               "different one (its own files only: anything else there stays, and is listed)."),
    seed: int = typer.Option(0, "--seed", metavar="N", help="Seed of the example builder's random choices."),
    validation_fraction: float = typer.Option(0.01, "--validation-fraction", metavar="SHARE",
                                              help="Share of documents held out for validation."),
    tokenizer_sample_mb: float = typer.Option(
        32.0, "--tokenizer-sample-mb", metavar="MB",
        help="Train the tokenizer on the first N MB of text (0 = all of it, held in memory; more is slower)."
    ),
) -> None:
    """Turn raw text into a tokenizer and packed ELECTRA pre-training examples.

    Documents end at blank lines, at WikiExtractor's </doc> (its title line is dropped) and at each jsonl/parquet
    record; examples never cross them, unless --pack-documents. The fill ratio (text / token slots) is reported.

    Lines are the sentence units of the official ELECTRA example builder (10% single segment, 5% random length).

    Binary or non-UTF-8 files (judged on their first 64 KiB) are skipped with a warning and listed in manifest.json.

    The output directory appears only when complete; running the same request again reuses it.
    """
    from tinyelectra.prepare import prepare as run_prepare

    run_prepare(
        sources=list(corpus), out_dir=out, tokenizer_path=tokenizer, vocab_size=vocab_size, seq_len=seq_len,
        casing=casing, workers=workers, force=force, seed=seed, command=_command_line(),
        validation_fraction=validation_fraction, tokenizer_sample_mb=tokenizer_sample_mb, tokenizer_type=tokenizer_type,
        sentencepiece_model=sentencepiece_model, byte_fallback=byte_fallback, character_coverage=character_coverage,
        pack_documents=pack_documents,
    )


@app.command()
def train(
    budget: str = typer.Option(
        ..., "--budget", metavar="BUDGET", help="Wall clock on this machine (4d, 36h, 90m, 1h30m, 45s), "
        "paper-convention FLOPs (1.4e18flops), steps (62500steps, 1Msteps), or 'paper' (the recipe's full schedule). "
        "Step and FLOP budgets reproduce a run (the same steps; bit-identical weights with --set "
        "train.deterministic=true); a time budget does not, by design: how many steps fit depends on the machine's "
        "speed and load."
    ),
    data: Optional[Path] = typer.Option(
        None, "--data", metavar="DIR", help="A directory written by `tinyelectra prepare`. Without --data or --corpus "
        "the run trains on the built-in smoke-test corpus (about 2 MB of Python's own documentation: for trying "
        "things, not for pre-training)."),
    corpus: Optional[list[str]] = typer.Option(None, "--corpus", metavar="SOURCE",
                                               help="Prepare these sources first (cached under the run)."),
    recipe: str = typer.Option(
        "electra-small", "--recipe", metavar="NAME|FILE", help="A shipped recipe's name (`tinyelectra recipe` lists "
        "them) or a .toml path. The default, electra-small, is the paper's model with its 1M-step schedule (4 days on "
        "a V100); 'tiny' is a small CPU recipe."),
    gpu: Optional[int] = typer.Option(None, "--gpu", metavar="INDEX", help="CUDA device index."),
    device: Optional[str] = typer.Option(None, "--device", metavar="DEVICE", help="'cpu' (or a torch device string)."),
    out: Optional[Path] = typer.Option(None, "--out", metavar="DIR",
                                       help="Run directory (default runs/RECIPE-BUDGET)."),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the run in --out where it stopped (from step 0 if it stopped during "
        "start-up, before its first resume state). A finished run is left as it is."),
    force: bool = typer.Option(
        False, "--force", help="Start over: delete the run already in --out first (its resume state, fraction "
        "checkpoints, plan, metrics, summary, and the GLUE results, report and exports made from them: what the run "
        "folder's records say tinyelectra wrote), listing what it deleted and what it kept. Nothing is ever deleted "
        "without it, and never a file no record lists, at any depth; a run folder of an older tinyelectra (no "
        "record) is refused."),
    init: Optional[Path] = typer.Option(
        None, "--init", metavar="DIR", help="Start from these weights (continued pre-training): a tinyelectra "
        "checkpoint, a `tinyelectra export` directory, or a transformers ELECTRA discriminator directory. Shapes must "
        "match the recipe."
    ),
    stop_after: Optional[list[str]] = typer.Option(
        None, "--stop-after", metavar="STEPS|TIME", help="End this command early, cleanly, with the schedule left as "
        "--budget planned it: after that step (62500steps: the paper's 6.25% checkpoint, with the paper's learning "
        "rate there) or after that much time of this command (6h: start-up included; the step running then is "
        "finished). Repeatable: the first reached wins. It writes a checkpoint of where it stopped (named by its "
        "share of the schedule, e.g. ckpt-0400 at 4%) and a resume state; continue with --resume (with another "
        "--stop-after, or none to run to the end)."),
    initial_checkpoint: bool = typer.Option(
        False, "--initial-checkpoint", help="Also write ckpt-0000: the run's weights at step 0, before any training, "
        "with their held-out evaluation: the no-pre-training control that `tinyelectra glue` fine-tunes beside the "
        "others."),
    set_: Optional[list[str]] = typer.Option(None, "--set", metavar="SECTION.KEY=VALUE",
                                             help="Override a recipe field: section.key=value (repeatable)."),
) -> None:
    """Pre-train within a budget; checkpoints at 6.25%, 12.5%, 25%, 50% and 100% of it.

    The five checkpoints are snapshots of ONE run whose learning-rate schedule spans the whole budget (the paper's
    Table 1 "partial training"); a separately scheduled shorter run is simply a smaller --budget.
    A time budget is a shorter schedule of its own, not the paper's: the steps that fit in that much training time
    at the speed measured over the first steps (start-up, checkpoints and resume states excluded), fixed from then on
    and re-planned only when the run would end more than 2% of the budget away from it; plan.json says what
    happened. For the paper's schedule within a time, give --budget paper and --stop-after TIME.
    Ctrl-C (SIGINT) or SIGTERM saves a resume state and exits; --resume continues exactly where the run stopped.
    Running the same command on a finished run does nothing.
    """
    from tinyelectra.budget import parse_budget, parse_stop

    parse_budget(budget)  # a bad budget is refused before torch is imported (seconds)
    for text in stop_after or []:
        parse_stop(text)
    if resume and force:
        raise UserError("give either --resume (continue the run in --out) or --force (start it over), not both")
    from tinyelectra.train import train_command

    train_command(
        budget=budget, data_dir=data, corpus=corpus, recipe_name=recipe, gpu=gpu, device=device, out_dir=out,
        resume=resume, overrides=list(set_ or []), command=_command_line(), init=init, force=force,
        stop_after=list(stop_after or []), initial_checkpoint=initial_checkpoint,
    )


@app.command()
def flops(
    recipe: str = typer.Option("electra-small", "--recipe", metavar="NAME|FILE",
                               help="A shipped recipe's name (`tinyelectra recipe` lists them) or a .toml path."),
    steps: Optional[int] = typer.Option(None, "--steps", metavar="N", help="Training steps (default: the recipe's)."),
    batch: Optional[int] = typer.Option(None, "--batch", metavar="N",
                                        help="Sequences per step (default: the recipe's)."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", metavar="N",
                                          help="Tokens per sequence (default: the recipe's)."),
    set_: Optional[list[str]] = typer.Option(None, "--set", metavar="SECTION.KEY=VALUE",
                                             help="Override a recipe field: section.key=value."),
) -> None:
    """FLOPs of a recipe in the paper's convention and the hardware convention (for MFU)."""
    from tinyelectra.flops import flops_command

    flops_command(recipe_name=recipe, steps=steps, batch=batch, seq_len=seq_len, overrides=list(set_ or []))


@app.command()
def recipe(
    first: Optional[str] = typer.Argument(None, metavar="list|show|NAME", hidden=True),
    second: Optional[str] = typer.Argument(None, metavar="NAME", hidden=True),
    set_: Optional[list[str]] = typer.Option(None, "--set", metavar="SECTION.KEY=VALUE",
                                             help="Override a recipe field: section.key=value (repeatable)."),
) -> None:
    """Print a recipe as a run would use it (after --set), as TOML that --recipe accepts; or list the shipped ones.

    `tinyelectra recipe NAME` (or `recipe show NAME`): NAME is a shipped recipe's name or a .toml path.
    `tinyelectra recipe` (or `recipe list`): the shipped recipes, one line each.
    """
    from tinyelectra.config import recipe_command

    if first == "show":
        if second is None:
            raise UserError("recipe show: name a recipe (`tinyelectra recipe list` lists the shipped ones)")
        first, second = second, None
    if second is not None:
        raise UserError(f"recipe {first} {second}: give one recipe (recipe NAME, recipe show NAME or recipe list)")
    recipe_command(None if first == "list" else first, list(set_ or []))


@app.command()
def export(
    checkpoint: Path = typer.Argument(..., metavar="CHECKPOINT", hidden=True),
    out: Path = typer.Option(..., "--out", metavar="DIR", help="New output directory: discriminator/ "
                             "(ElectraForPreTraining) and generator/ (ElectraForMaskedLM), each with tokenizer files; "
                             "an MLM checkpoint writes generator/ only."),
    language: Optional[list[str]] = typer.Option(
        None, "--language", metavar="CODE", help="Language code(s) for the model card's metadata (default: those "
        "prepare guessed from the text's scripts: ko, ja, zh, en)."),
    license_id: Optional[str] = typer.Option(
        None, "--license", metavar="ID",
        help="License of the weights for the model card (e.g. apache-2.0, cc-by-sa-4.0)."),
) -> None:
    """Write a checkpoint as transformers ElectraForPreTraining / ElectraForMaskedLM directories (from_pretrained loads
    them offline).

    CHECKPOINT is a fraction checkpoint directory (e.g. runs/X/ckpt-10000).
    """
    from tinyelectra.hf import export_command

    export_command(checkpoint=checkpoint, out_dir=out, languages=list(language or []), license_id=license_id)


@app.command()
def glue(
    checkpoint: Path = typer.Option(
        ..., "--checkpoint", metavar="DIR",
        help="A run directory (every fraction), one checkpoint, or a transformers ELECTRA directory."),
    glue_dir: Optional[Path] = typer.Option(None, "--glue-dir", metavar="DIR", help="The classic glue_data directory."),
    hf: bool = typer.Option(False, "--hf", help="Read GLUE through Hugging Face `datasets` (needs the hub)."),
    task_file: Optional[list[Path]] = typer.Option(
        None, "--task-file", metavar="FILE", help="A task of your own (KLUE, JGLUE, CLUE, ASSIN, ...): a TOML file "
        "naming its TSV/CSV/JSONL files, text column(s), label column and metric (tinyelectra/docs/glue.md). "
        "Repeatable; without --glue-dir/--hf only these run."),
    tasks: str = typer.Option("all", "--tasks", metavar="TASKS",
                              help="Comma-separated tasks, or 'all' (those with data)."),
    seeds: int = typer.Option(3, "--seeds", metavar="N", help="Fine-tuning seeds per task; medians are reported."),
    task_seeds: Optional[str] = typer.Option(
        None, "--task-seeds", metavar="TASK=N,...", help="Fewer seeds for some tasks: their first N of --seeds (a "
        "plan cut to fit a time limit); glue.json records them."),
    released_lr: Optional[str] = typer.Option(
        None, "--released-lr", metavar="TASKS", help="Fine-tune these tasks a second time with the released code's "
        "learning rate and weight decay (1e-4 and 0.01 for Small; not the paper's), into "
        "OUT/<checkpoint>/released-lr/."),
    out: Optional[Path] = typer.Option(
        None, "--out", metavar="DIR", help="Where OUT/<checkpoint>/glue.json goes (default: RUN/glue for a run or its "
        "checkpoints, else CHECKPOINT/glue)."),
    gpu: Optional[int] = typer.Option(None, "--gpu", metavar="INDEX", help="CUDA device index."),
    device: Optional[str] = typer.Option(None, "--device", metavar="DEVICE", help="'cpu' (or a torch device string)."),
    max_train_rows: Optional[int] = typer.Option(None, "--max-train-rows", metavar="N",
                                                 help="Use only the first N training rows per task (quick checks)."),
    skip_bad_labels: bool = typer.Option(
        False, "--skip-bad-labels", help="Skip rows whose label is not one of the task's (or a score out of range) "
        "instead of stopping at the first; how many were skipped is printed beside the score."),
    config: Optional[Path] = typer.Option(
        None, "--config", metavar="FILE", help="A TOML file whose [finetune] table sets the keys below (a file of its "
        "own, or a recipe TOML that carries one); --set applies on top."),
    set_: Optional[list[str]] = typer.Option(
        None, "--set", metavar="KEY=VALUE", help="Override a fine-tuning setting, finetune.key=value as train's "
        "section.key=value (the section may be left out): lr, layerwise (intended|official|none), layerwise_decay, "
        "weight_decay, warmup_fraction, clip_norm, batch_size, batching (random|length), max_length, epochs, dropout, "
        "eval_batch_size, precision, seed, test_predictions, step (auto|eager|static|graphs), length_bucket, "
        "concurrent."
    ),
) -> None:
    """Fine-tune checkpoints on GLUE with the paper's protocol; medians over seeds.

    Per task: LR by model size (3e-4 Small), layer-wise LR decay 0.8, the paper's Adam, 10% warm-up, batch 32,
    length 128, 3 epochs (10 for RTE and STS-B), [CLS] -> dropout -> linear. Finished tasks are reused when the
    same command is run again. Test-set predictions (GLUE submission files) come from the median seed.
    """
    from tinyelectra.glue import GlueSettings, glue_command

    glue_command(GlueSettings(
        checkpoint=checkpoint, glue_dir=glue_dir, use_hf=hf, tasks=tasks, seeds=seeds, out_dir=out, gpu=gpu,
        device=device, max_train_rows=max_train_rows, overrides=list(set_ or []), command=_command_line(),
        task_files=list(task_file or []), config=config, skip_bad_labels=skip_bad_labels, task_seeds=task_seeds,
        released_lr=released_lr,
    ))


@app.command()
def report(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", hidden=True),
    out: Optional[Path] = typer.Option(None, "--out", metavar="DIR",
                                       help="Where report.md, report.json and plots go (default: RUN_DIR)."),
) -> None:
    """FLOPs-versus-GLUE report beside the paper's Table 1: report.md, report.json, PNG plots.

    RUN_DIR is a run directory with GLUE results (from `tinyelectra glue`), or the --out of `tinyelectra glue`.
    """
    from tinyelectra.report import report_command

    report_command(run_dir=run_dir, out_dir=out)


def _expand_multi_value(argv: list[str], flag: str) -> list[str]:
    """Let `--corpus a b c` mean `--corpus a --corpus b --corpus c` (click options take one value each)."""
    out: list[str] = []
    state = ""  # "value": the word after the flag (taken as it is); "more": words after that value, up to an option
    for arg in argv:
        if state == "more" and not arg.startswith("-"):
            out += [flag, arg]
            continue
        out.append(arg)
        state = "more" if state == "value" else "value" if arg == flag else ""
    return out


def main() -> None:
    from tinyelectra.errors import Interrupted, interrupts_raise
    from tinyelectra.files import WRITE_ERRNOS, os_error_line

    if "torch" not in sys.modules and not {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & os.environ.keys():
        # torch's OpenMP threads wait for work by sleeping, not spinning: with another program busy on one of two
        # cores, spinning made training 2-21x slower (benchmarks/NOTES.md). OpenMP reads this once, when torch loads
        # it (inside a command); runtime.openmp_note says in the run's log who chose it.
        os.environ.update(OMP_WAIT_POLICY="PASSIVE", TINYELECTRA_SET_OMP_WAIT_POLICY="1")
    sys.argv[1:] = _expand_multi_value(sys.argv[1:], "--corpus")
    try:
        with interrupts_raise():  # SIGTERM too runs clean-up; commands say what they kept before this ends them
            code = app(standalone_mode=False)  # click's usage errors are raised here, not printed as a usage block
    except HELP_FOR_NO_ARGS as e:  # `tinyelectra` alone: the help
        e.show()
        sys.exit(e.exit_code)
    except click_errors.ClickException as e:  # a missing or unknown option, a value of the wrong type, ...
        print(f"error: {_usage_error_line(e)}", file=sys.stderr)
        sys.exit(2)
    except UserError as e:
        print(f"error: {_one_line(str(e))}", file=sys.stderr)
        sys.exit(e.exit_code)
    except OSError as e:
        if e.errno not in WRITE_ERRNOS:
            raise
        print(f"error: {_one_line(os_error_line(e))}", file=sys.stderr)  # a full disk, a read-only location, ...
        sys.exit(2)
    except (Interrupted, KeyboardInterrupt) as e:
        print(f"interrupted ({getattr(e, 'signal_name', 'SIGINT')})", file=sys.stderr)
        sys.exit(getattr(e, "exit_code", 130))
    sys.exit(code if isinstance(code, int) else 0)  # --help and --version end as typer.Exit(0): returned here


def _usage_error_line(e) -> str:
    """click's usage error as one line: what was wrong (the option, and the value typed when it was given once) and
    where the help is ("see tinyelectra train --help")."""
    ctx, param = getattr(e, "ctx", None), getattr(e, "param", None)
    names = []
    while ctx is not None and ctx.parent is not None:  # the subcommand's name (the program's is "tinyelectra")
        names.append(ctx.info_name)
        ctx = ctx.parent
    if getattr(e, "ctx", None) is None and sys.argv[1:] and not sys.argv[1].startswith("-"):  # the option parser's
        names.append(sys.argv[1])  # errors (an option without its value) come without a context: the command typed
    message = e.format_message()
    if type(e) is click_errors.BadParameter and param is not None and param.opts:  # a value that is not of its type
        typed = [v for flag in param.opts for v in _values_typed(sys.argv[1:], flag)]
        message = (f"{param.opts[0]}{f' {typed[0]!r}' if len(typed) == 1 else ''}: "
                   f"{e.message[:1].lower()}{e.message[1:]}")
    return f"{_one_line(message).rstrip('.')}; see {' '.join(['tinyelectra', *reversed(names)])} --help"


def _values_typed(argv: list[str], flag: str) -> list[str]:
    """The values given to `flag` on the command line: `--flag VALUE` or `--flag=VALUE`."""
    return [argv[i + 1] if arg == flag else arg.split("=", 1)[1] for i, arg in enumerate(argv)
            if (arg == flag and i + 1 < len(argv)) or arg.startswith(flag + "=")]


def _one_line(text: str) -> str:
    return " ".join(text.split())


if __name__ == "__main__":
    main()
