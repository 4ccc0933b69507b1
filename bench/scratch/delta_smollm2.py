"""One measurement for issue 56 (not a benchmark of record): how much of SmolLM2-135M-Instruct changes
per AdamW step, in its bfloat16 and float32 images, and what the delta codec makes of it.

Three AdamW steps (the trainer's settings, ``services/trainer/learner.py``: lr 2e-5, default betas
and eps, weight decay 0, gradients clipped to norm 1.0) on a random-token batch (causal LM loss),
one thread. After each step, per dtype: the share of elements whose bytes changed and the encoded
delta's bytes as a share of the full version's (the trainer's state dict, tied ``lm_head.weight``
included, as ``manifest_of`` lays it out), under two definitions: ``planes_only`` (the changed
values' new bytes, byte plane by byte plane: format 1's values, ``codings=("planes",)``) and
``value_codings`` (format 2's choice per tensor of planes, zigzag difference varints or difference
planes). Each tensor's frame is applied to the previous image and the result's chunk digests give
the version digest, checked against the new image's.

Lean on memory (the machine it ran on had ~3 GB free): AdamW's moments and the previous images live
in file-backed maps under ``--scratch`` (the kernel can write them back), and versions are encoded
tensor by tensor rather than as whole blobs.

    nice -n 10 .venv/bin/python bench/scratch/delta_smollm2.py MODEL_DIR [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import numpy as np


def _file_backed(path: Path, nbytes: int) -> np.memmap:
    return np.memmap(path, dtype=np.uint8, mode="w+", shape=(max(nbytes, 1),))


def _moments_on_disk(opt, params, scratch: Path) -> None:
    """AdamW's state as ``_init_group`` makes it, but its moments in file-backed maps (zeros)."""
    import torch

    total = sum(p.numel() for p in params) * 4
    maps = [_file_backed(scratch / f"adam-{k}.bin", total) for k in ("m", "v")]
    pos = 0
    for p in params:
        n = p.numel() * 4
        m, v = (torch.from_numpy(mm[pos : pos + n]).view(torch.float32).view(p.shape) for mm in maps)
        opt.state[p] = {"step": torch.tensor(0.0), "exp_avg": m, "exp_avg_sq": v}
        pos += n


def _raw(tensor, dtype) -> np.ndarray:
    """A tensor's bytes in ``dtype`` (a float32 parameter: a view, no copy)."""
    import torch

    return tensor.detach().to(dtype).contiguous().view(-1).view(torch.uint8).numpy()


DEFINITIONS = {"planes_only": ("planes",), "value_codings": None}  # format 1's values; format 2's choice


def _step_delta(manifest, state, dtype, prev: np.memmap, level: int) -> dict:
    """Encode every tensor's delta from ``prev`` (updated to the new image) under both definitions,
    apply each to a copy of ``prev``, and compare the applied versions' digests with the new image's."""
    from services.common.weights import chunk_digest, version_digest
    from services.weights import delta as D

    out = {k: dict(changed=0, delta_bytes=0, raw_bytes=0, modes={}, codings={}, encode_cpu_s=0.0, apply_cpu_s=0.0)
           for k in DEFINITIONS}
    applied_d, new_d, elements = {k: [] for k in DEFINITIONS}, [], 0
    for i, t in enumerate(manifest.tensors):
        new = _raw(state[t.name], dtype)
        old = prev[t.offset : t.offset + t.nbytes]
        size = D.itemsize_of(t.dtype)
        spans = [slice(r.tensor_offset, r.tensor_offset + r.length) for r in manifest.plan if r.name == t.name]
        for k, codings in DEFINITIONS.items():
            o = out[k]
            t0 = time.process_time()
            frame = D.encode(old, new, size, index=i, name=t.name, level=level, codings=codings or D.CODINGS)
            o["encode_cpu_s"] += time.process_time() - t0
            base = bytearray(old)
            t0 = time.process_time()
            o["changed"] += D.apply(base, frame)
            o["apply_cpu_s"] += time.process_time() - t0
            d = D.decode(frame)
            o["modes"][d.mode] = o["modes"].get(d.mode, 0) + 1
            o["codings"][d.coding] = o["codings"].get(d.coding, 0) + 1
            o["delta_bytes"] += len(frame)
            o["raw_bytes"] += d.raw_bytes
            applied_d[k].extend(chunk_digest(memoryview(base)[span]) for span in spans)
            del base, frame, d
        new_d.extend(chunk_digest(new[span]) for span in spans)
        elements += t.nbytes // size
        old[:] = new
    for k, o in out.items():
        o["digest_equal"] = version_digest(applied_d[k]) == version_digest(new_d)
        o["changed_fraction"] = o["changed"] / elements
        o["byte_share"] = o["delta_bytes"] / manifest.total_bytes
        o["byte_share_before_zlib"] = o["raw_bytes"] / manifest.total_bytes
        o["encode_cpu_s"], o["apply_cpu_s"] = round(o["encode_cpu_s"], 1), round(o["apply_cpu_s"], 1)
    return dict(elements=elements, full_bytes=manifest.total_bytes, **out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--level", type=int, default=1, help="zlib level of the delta (0: none)")
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/braid-delta-scratch"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    from services.common.weights import TensorSpec, manifest_of

    torch.set_num_threads(1)
    torch.manual_seed(0)
    args.scratch.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=2e-5, weight_decay=0.0)  # the trainer's: learner.py, smollm2-arith.yaml
    _moments_on_disk(opt, params, args.scratch)
    ids = torch.randint(0, model.config.vocab_size, (2, 64))
    dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32}
    state = model.state_dict()
    manifests = {k: manifest_of({n: TensorSpec(k, tuple(v.shape)) for n, v in state.items()}, 4 << 20) for k in dtypes}
    prev = {k: _file_backed(args.scratch / f"prev-{k}.bin", m.total_bytes) for k, m in manifests.items()}
    for k, m in manifests.items():
        for t in m.tensors:
            prev[k][t.offset : t.offset + t.nbytes] = _raw(state[t.name], dtypes[k])
    rows = []
    for step in range(1, args.steps + 1):
        t0 = time.process_time()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(params, 1.0))
        opt.step()
        opt.zero_grad(set_to_none=True)
        row = dict(step=step, loss=round(float(loss), 4), grad_norm=round(norm, 3),
                   train_cpu_s=round(time.process_time() - t0, 1))
        state = model.state_dict()
        for k, dt in dtypes.items():
            row[k] = _step_delta(manifests[k], state, dt, prev[k], args.level)
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = dict(model=args.model, tensors=len(manifests["float32"].tensors), level=args.level,
               optimizer="AdamW lr 2e-5 betas (0.9, 0.999) eps 1e-8 weight_decay 0, clip 1.0",
               batch="2 x 64 random tokens, causal LM loss", torch=torch.__version__, steps=rows,
               peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
    if args.out is not None:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    for f in args.scratch.glob("*.bin"):
        f.unlink()


if __name__ == "__main__":
    main()
