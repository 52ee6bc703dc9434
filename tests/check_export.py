"""Load a `tinyelectra export` directory with plain transformers (tinyelectra is not imported) and check what a user
relies on. Run by tests in other environments: a fresh virtual environment holding the built wheel, other
transformers versions. Not a test module itself (pytest collects test_*.py only).

Usage: python check_export.py EXPORT_DIR EXPECTED_JSON
EXPECTED_JSON holds what tinyelectra's own tokenizer says: {"max_positions": N, "cls_id": i, "sep_id": j,
"pairs": [[text_a, text_b, ids_a, ids_b], ...], "round_trip": [text, ...], "round_trip_ignoring_spaces": bool}.
Prints one JSON line of facts; exits 1 with the first failed check.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def fail(message: str) -> None:
    print(f"FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def main(export_dir: str, expected_path: str) -> None:
    import torch
    import transformers
    from transformers import AutoTokenizer, ElectraForPreTraining, pipeline

    want = json.loads(Path(expected_path).read_text(encoding="utf-8"))
    disc_dir, gen_dir = Path(export_dir) / "discriminator", Path(export_dir) / "generator"
    tok = AutoTokenizer.from_pretrained(str(disc_dir))
    n = want["max_positions"]
    if tok.model_max_length != n:
        fail(f"model_max_length {tok.model_max_length}, the model has {n} positions")
    for a, b, ids_a, ids_b in want["pairs"]:
        enc = tok(a, b)
        ids = [want["cls_id"], *ids_a, want["sep_id"], *ids_b, want["sep_id"]]
        if enc["input_ids"] != ids:
            fail(f"pair {a!r} / {b!r}: {enc['input_ids']} instead of [CLS] A [SEP] B [SEP] = {ids}")
        types = [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1)
        if enc.get("token_type_ids") != types:
            fail(f"pair {a!r} / {b!r}: token_type_ids {enc.get('token_type_ids')} instead of {types}")
    squeeze = (lambda t: "".join(t.split())) if want["round_trip_ignoring_spaces"] else (lambda t: t)
    for line in want["round_trip"]:
        back = tok.decode(tok(line)["input_ids"], skip_special_tokens=True)
        if squeeze(back) != squeeze(line):
            fail(f"decode(encode(x)) != x: {line!r} -> {back!r}")
    long_text = " ".join(want["round_trip"]) * 4
    batch = tok([long_text, want["round_trip"][0]], truncation=True, padding=True, return_tensors="pt")
    if batch["input_ids"].shape[1] != n:
        fail(f"truncation=True gave {batch['input_ids'].shape[1]} tokens, not the model's {n}")
    disc = ElectraForPreTraining.from_pretrained(str(disc_dir)).eval()
    with torch.no_grad():
        logits = disc(**batch).logits
    if tuple(logits.shape) != tuple(batch["input_ids"].shape) or not torch.isfinite(logits).all():
        fail(f"ElectraForPreTraining gave logits of shape {tuple(logits.shape)}")
    fill = pipeline("fill-mask", model=str(gen_dir), tokenizer=str(gen_dir))
    masked = f"{want['round_trip'][0]} {fill.tokenizer.mask_token}"
    predictions = fill(masked, top_k=3)
    if len(predictions) != 3 or not all("token_str" in p for p in predictions):
        fail(f"fill-mask gave {predictions!r}")
    print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__,
                      "tokenizer_class": type(tok).__name__, "pairs": len(want["pairs"]),
                      "round_trips": len(want["round_trip"]), "model_max_length": tok.model_max_length}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
