"""The Triton decode kernels under Triton's CPU interpreter, against the torch code they replace.

Run by test_qwen3_decode_kernels.py in a subprocess: TRITON_INTERPRET must be set before the kernels
are defined, and must not leak into the rest of the suite. Float32 throughout (the interpreter does not
do bfloat16 arithmetic); exits non-zero on the first mismatch.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from qwen3_tiny import build_tiny_checkpoint  # noqa: E402

from streamvox.models.qwen3_tts.kernels import triton_decode as dk  # noqa: E402
from streamvox.models.qwen3_tts.kernels.triton_decode import attention as dka  # noqa: E402
from streamvox.models.qwen3_tts.kernels.triton_decode import matmul as dkm  # noqa: E402
from streamvox.models.qwen3_tts.kernels.triton_sampling import sample_scores  # noqa: E402
from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel  # noqa: E402
from streamvox.models.qwen3_tts.model.layers import apply_rope, rope_inv_freq  # noqa: E402
from streamvox.models.qwen3_tts.runtime.fast_path import FrameStepper  # noqa: E402
from streamvox.models.qwen3_tts.runtime.fast_sampling import sampled_scores  # noqa: E402
from streamvox.models.qwen3_tts.runtime.kv_cache import SlotCache  # noqa: E402
from streamvox.models.qwen3_tts.sampling import SamplerSettings  # noqa: E402
from streamvox.settings import Qwen3Settings  # noqa: E402

EPS = 1e-6


def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def close(name: str, got: torch.Tensor, want: torch.Tensor, tol: float = 1e-5) -> None:
    err = float((got - want).abs().max())
    print(f"{name}: max abs error {err:.2e}")
    assert err < tol, f"{name}: max abs error {err} >= {tol}"


def linear_cases() -> None:
    for m, k, n in ((1, 96, 80), (3, 100, 48), (20, 64, 130)):
        x, w = torch.randn(m, k), torch.randn(n, k) / 10
        nw, res = torch.rand(k) + 0.5, torch.randn(m, n)
        close(f"linear m={m}", dk.linear(x, w), x @ w.T)
        close(f"linear+norm+residual m={m}", dk.linear(x, w, norm=nw, eps=EPS, residual=res), rms(x, nw) @ w.T + res)
        if n % 2 == 0:
            g, u = (rms(x, nw) @ w.T).chunk(2, dim=-1)
            close(f"linear+norm+swiglu m={m}", dk.linear(x, w, norm=nw, eps=EPS, swiglu=True), F.silu(g) * u)
        default_config = dkm._linear_config
        # split-K, three programs per tile: tl.dot tiles, and the narrow tiles summed without tensor cores
        for config in ((16, 16, 32, 4, 1, 3, True), (4, 8, 32, 4, 1, 3, False)):
            dkm._linear_config = lambda *_a, c=config: c
            try:
                want = rms(x, nw) @ w.T + res
                for _ in range(2):  # the tile counters are back at zero for the second launch
                    close(f"split-K {config} linear+norm+residual m={m}",
                          dk.linear(x, w, norm=nw, eps=EPS, residual=res), want)
                    assert not dkm.tile_counters(x.device).any()
                if n % 2 == 0:
                    g, u = (rms(x, nw) @ w.T).chunk(2, dim=-1)
                    close(f"split-K {config} linear+norm+swiglu m={m}",
                          dk.linear(x, w, norm=nw, eps=EPS, swiglu=True), F.silu(g) * u)
            finally:
                dkm._linear_config = default_config
        bias, table = torch.randn(n), torch.randn(300, k)
        scores = torch.randn(m, 300)
        scores[0, 7] = scores[0, 290] = float(scores[0].max()) + 1  # a tie: the first maximum wins
        tokens = torch.full((m, 3), -1)
        total = torch.randn(m, k)
        want_total = total + table[scores.argmax(-1)]
        got = dk.linear(table, w, bias=bias, select=scores, tokens=tokens[:, 1], total=total)
        assert torch.equal(tokens[:, 1], scores.argmax(-1)) and tokens[0, 1] == 7 and (tokens[:, [0, 2]] == -1).all()
        close(f"linear+select+bias m={m}", got, F.linear(table[scores.argmax(-1)], w, bias))
        assert torch.equal(total, want_total), "linear+select: the embedding sum"
        tokens[:, 1] = -1
        got = dk.select_rows(scores, table, tokens[:, 1], total)
        assert torch.equal(tokens[:, 1], scores.argmax(-1)) and (tokens[:, [0, 2]] == -1).all()
        assert torch.equal(got, table[scores.argmax(-1)]) and torch.equal(total, want_total + got), "select_rows"
        got = dk.linear(x.half(), w.half(), out_dtype=torch.float32)  # rounded to float16, stored as float32
        assert got.dtype == torch.float32
        close(f"linear float16 to float32 m={m}", got, (x.half().float() @ w.half().float().T).half().float(), 1e-2)


def cublas_cases() -> None:
    """From CUBLAS_MIN_ROWS rows, `linear` is a cuBLAS GEMM between a Triton RMSNorm and SwiGLU: the same
    fusions, the same results."""
    dkm.CUBLAS_MIN_ROWS = 1
    try:
        for m, k, n in ((1, 96, 80), (20, 64, 130)):
            x, w = torch.randn(m, k), torch.randn(n, k) / 10
            nw, res, bias = torch.rand(k) + 0.5, torch.randn(m, n), torch.randn(n)
            close(f"cuBLAS linear+norm+residual m={m}", dk.linear(x, w, norm=nw, eps=EPS, residual=res),
                  rms(x, nw) @ w.T + res)
            g, u = (rms(x, nw) @ w.T).chunk(2, dim=-1)
            close(f"cuBLAS linear+norm+swiglu m={m}", dk.linear(x, w, norm=nw, eps=EPS, swiglu=True), F.silu(g) * u)
            close(f"cuBLAS linear+bias m={m}", dk.linear(x, w, bias=bias), x @ w.T + bias)
            got = dk.linear(x.half(), w.half(), out_dtype=torch.float32)
            assert got.dtype == torch.float32
            want = (x.half().float() @ w.half().float().T).half().float()
            close(f"cuBLAS linear float16 to float32 m={m}", got, want, 1e-2)
        close("rms_norm", dk.rms_norm(x, nw, EPS), rms(x, nw))
        gu = torch.randn(5, 2 * 1500)  # more columns than one program's block
        close("swiglu_rows", dk.swiglu_rows(gu), F.silu(gu[:, :1500]) * gu[:, 1500:])
    finally:
        dkm.CUBLAS_MIN_ROWS = 1 << 20


def attention_cases() -> None:
    heads, kv_heads, hd, slots = 4, 2, 12, 3  # head_dim not a power of two, as the tiny predictor
    qn, kn = torch.rand(hd) + 0.5, torch.rand(hd) + 0.5
    inv_freq = rope_inv_freq(hd, 10000.0)
    # (slots, positions, cache length, kernel, split_attend's width and positions per program): a
    # predictor-sized cache (one block of positions) and a longer one (several blocks; 139 positions: not a
    # whole number of them); split_attend over one to five blocks, a position at a block's start, and a
    # free slot's stale position past the width (attends to [0, width), stores nothing)
    cases = (([0, 2, 2, 1], [3, 0, 1, 7], 10, "decode_attention", 0, 0),
             ([2, 0, 1], [5, 0, 9], 10, "rope_attend", 0, 0), ([1, 2, 0], [139, 0, 64], 150, "rope_attend", 0, 0),
             ([2, 0, 1], [5, 0, 9], 10, "split_attend", 10, 4), ([1, 2, 0], [139, 0, 64], 150, "split_attend", 150, 32),
             ([0, 1], [3, 12], 16, "split_attend", 10, 4))
    for slot, pos, length, kernel, width, per_program in cases:
        slot, pos = torch.tensor(slot), torch.tensor(pos)
        m = len(slot)
        qkv = torch.randn(m, (heads + 2 * kv_heads) * hd)
        kc, vc = torch.randn(slots, kv_heads, length, hd), torch.randn(slots, kv_heads, length, hd)
        want_k, want_v = kc.clone(), vc.clone()
        q, k, v = qkv.split([heads * hd, kv_heads * hd, kv_heads * hd], dim=-1)
        f = pos.float()[:, None] * inv_freq
        emb = torch.cat([f, f], dim=-1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]  # [m, 1, hd]
        q = apply_rope(rms(q.view(m, heads, hd), qn)[:, :, None], cos, sin)[:, :, 0]
        k = apply_rope(rms(k.view(m, kv_heads, hd), kn)[:, :, None], cos, sin)[:, :, 0]
        seen = []  # each row's attended positions: [0, pos] (or [0, width) past the width)
        for i in range(m):
            stale = width and pos[i] >= width
            if not stale:
                want_k[slot[i], :, pos[i]] = k[i]
                want_v[slot[i], :, pos[i]] = v.view(m, kv_heads, hd)[i]
            seen.append(width if stale else pos[i] + 1)
        want = torch.stack([
            F.scaled_dot_product_attention(q[i][:, None], want_k[slot[i], :, : seen[i]],
                                           want_v[slot[i], :, : seen[i]], enable_gqa=True)[:, 0].reshape(-1)
            for i in range(m)])
        if kernel == "split_attend":
            dka.SPLIT_POSITIONS = per_program
            out = dk.split_attend(qkv, qn, kn, inv_freq, kc, vc, slot, pos, heads, EPS, width)
            assert not dkm.tile_counters(out.device).any(), "split_attend left a counter set"
        elif kernel == "rope_attend":
            out = dk.rope_attend(qkv, qn, kn, inv_freq, kc, vc, slot, pos, heads, EPS)
        else:
            got_q = dk.qk_norm_rope_store(qkv, qn, kn, inv_freq, kc, vc, slot, pos, heads, kv_heads, EPS)
            close("q norm + rope", got_q, q)
            out = dk.decode_attention(got_q, kc, vc, slot, pos)
        close(f"{kernel}: keys in cache", kc, want_k)
        close(f"{kernel}: values in cache", vc, want_v)
        close(kernel, out, want)


def choose_commit_cases() -> None:
    """`choose_commit` against the argmax of `FrameStepper._scores` (greedy) and `_record` (called on the same
    state) and `_commit`'s updates: penalised, suppressed and too-early end-of-speech ids over three rows (one
    inactive), a vocabulary of more than one block."""
    m, v, h = 3, 2500, 40
    logits, hid = torch.randn(m, v) * 3, torch.randn(m, h)
    seen = torch.rand(m, v) < 0.3
    logits[0, 1700] = 50.0  # row 0's best: penalised (seen, positive, divided by its penalty of 10)
    seen[0, 1700] = True
    logits[1, 40] = logits[1, 2100] = 40.0  # a tie: the first maximum wins
    logits[2, 2499] = 60.0  # end-of-speech, banned for row 2 (count below the minimum)
    suppress, eos = torch.zeros(v, dtype=torch.bool), torch.zeros(v, dtype=torch.bool)
    suppress[2000:2400] = True
    eos[2499] = True
    penalty, count, pos = torch.tensor([10.0, 1.3, 1.1]), torch.tensor([5, 0, 1]), torch.tensor([9, 4, 7])
    active, token, hidden = torch.tensor([True, False, True]), torch.tensor([11, 12, 13]), torch.randn(m, h)
    ref = SimpleNamespace(penalty=penalty, seen=seen.clone(), suppress=suppress, eos_mask=eos, count=count.clone(),
                          min_new=2)
    want = FrameStepper._scores(ref, logits, slice(0, m), sample=False).argmax(-1)
    assert want[0] != 1700 and want[1] == 40 and want[2] != 2499
    FrameStepper._record(ref, want, slice(0, m), active)
    w_token, w_hidden = torch.where(active, want, token), torch.where(active[:, None], hid, hidden)
    w_seen, w_count, w_pos = ref.seen, ref.count, pos + active.long()
    dk.choose_commit(logits, hid, penalty, seen, suppress, eos, count, pos, active, token, hidden, 2)
    for name, got, exp in (("token", token, w_token), ("hidden", hidden, w_hidden), ("seen", seen, w_seen),
                           ("count", count, w_count), ("pos", pos, w_pos)):
        assert torch.equal(got, exp), f"choose_commit: {name}\n{got}\n{exp}"
    print("choose_commit: identical")


def sampling_cases() -> None:
    """`sample_scores` against its torch twin `fast_sampling.sampled_scores`: the same scores (the warp's cuts
    identical, the noise's float64 logarithms within rounding) over vocabularies of one and of a padded block
    (2100 of 4096), with suppressed ids and ties, per-row temperature / top-k / top-p, greedy rows untouched."""
    t = torch.tensor([0.9, 0.0, 1.0, 0.5, 1.3, 0.7])
    k, p = torch.tensor([50, 0, 0, 7, 5000, 3]), torch.tensor([1.0, 1.0, 0.8, 0.95, 1.0, 0.5])
    seed = torch.tensor([0, 5, -(1 << 63), (1 << 63) - 1, 123456789, 77])
    counter = torch.tensor([0, 1, 7, 300, 2, 1 << 40])
    for v, codebook in ((2048, 0), (2100, 15)):
        logits = torch.randn(6, v) * 3
        logits[:, 2000:2040] = float("-inf")
        logits[5, 10] = logits[5, 11] = logits[5, 12] = 30.0  # ties at the top-k cut
        want = sampled_scores(logits, t, k, p, seed, counter, codebook)
        got = sample_scores(logits, t, k, p, seed, counter, codebook)
        assert torch.equal(torch.isinf(got), torch.isinf(want)), f"sample_scores v={v}: other cuts"
        assert torch.equal(got[1], logits[1])
        finite = ~torch.isinf(want)
        close(f"sample_scores v={v} codebook {codebook}", got[finite], want[finite], 1e-5)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    print("sample_scores: identical choices")


def _stepper(model: Qwen3TTSModel, slots: int, kernels: bool) -> FrameStepper:
    """A float32 frame stepper without graphs or torch.compile over a fresh 64-position cache of `slots` slots."""
    tc = model.cfg.talker
    cache = SlotCache(tc.num_hidden_layers, slots, tc.num_key_value_heads, 64, tc.head_dim, torch.float32,
                      model.device)
    return FrameStepper(model, cache, torch.zeros(tc.vocab_size, dtype=torch.bool), tc.codec_eos_token_id, 2,
                        use_graphs=False, use_kernels=kernels, settings=Qwen3Settings(compile="0"))


def one_row_case(ckpt: str) -> None:
    """One row (the one-stream step): a frame step's codes equal those of the torch layers."""
    model = Qwen3TTSModel.from_pretrained(ckpt)
    tc = model.cfg.talker
    results = []
    for kernels in (False, True):
        torch.manual_seed(0)
        st = _stepper(model, 2, kernels)
        st.reset_slot(0, 1.1)
        st.prefill_batch([0], [torch.randn(9, tc.hidden_size)])
        st.set_inputs([True], [3], 1)
        st.step(1, 64)
        results.append((st.frames[:1].clone(), st.hidden[:1].clone()))
    (f0, h0), (f1, h1) = results
    assert torch.equal(f0, f1), f"one row: codes differ:\n{f0}\n{f1}"
    close("one row: hidden state", h1, h0, 1e-4)
    print("one row: codes identical")


def frame_step_case(ckpt: str, sampled: bool = False) -> None:
    """Four rows (one inactive, prompts of different lengths): the frame step's codes with the kernels
    equal those of its torch layers, its hidden states within float32 rounding; with the kernels, both
    ways between predictor passes: the fused select GEMM (a linear projection) and the torch argmax and
    lookup (any other projection, as the 0.6B model's identity; here the same linear, wrapped); with
    the GEMMs of rows >= 2 in cuBLAS (CUBLAS_MIN_ROWS); and with the talker's attention as a cache write and
    SDPA instead of `split_attend` (here over blocks of 4 positions, so over up to three blocks). `sampled`:
    rows 0 and 2 sample (the step's sampled variant, the first three ways only), row 1 stays greedy."""
    model = Qwen3TTSModel.from_pretrained(ckpt)
    tc = model.cfg.talker
    cp = model.talker.code_predictor
    linear_proj = cp.small_to_mtp_projection
    results = []
    variants = ((False, False, "torch layers"), (True, False, "fused select"), (True, True, "torch select"),
                (True, False, "cuBLAS GEMMs"), (True, False, "talker SDPA"))[: 3 if sampled else 5]
    sampling = SamplerSettings(0.9, 50, 0.95, 1.1)
    dka.SPLIT_POSITIONS = 4
    for kernels, wrapped, name in variants:
        cp.small_to_mtp_projection = torch.nn.Sequential(linear_proj) if wrapped else linear_proj
        dkm.CUBLAS_MIN_ROWS = 2 if name == "cuBLAS GEMMs" else 1 << 20
        torch.manual_seed(0)
        st = _stepper(model, 5, kernels)
        assert st.kernels == kernels
        if name == "talker SDPA":
            st.split_attend_max_rows = 0
        prompts = torch.randn(3, 7, tc.hidden_size)
        for i in range(3):
            if sampled and i != 1:
                st.reset_slot(i, 1.1, sampling, sampling, seed=11 + i)
            else:
                st.reset_slot(i, 1.1)
        st.prefill_batch([0, 1, 2], [prompts[0], prompts[1, :5], prompts[2, :3]])
        frames = []
        for k in range(2):
            st.set_inputs([True, k == 0, True, False], [3, 4, 5, 6], 4)
            st.step(4, 64, sampled)
            frames.append(st.frames[:4].clone())
        results.append((torch.stack(frames), st.hidden[:4].clone(), st.pos[:4].clone()))
    f0, h0, p0 = results[0]
    for (*_, name), (f1, h1, p1) in zip(variants[1:], results[1:], strict=True):
        assert torch.equal(f0, f1), f"{name}: codes differ:\n{f0}\n{f1}"
        assert torch.equal(p0, p1)
        close(f"frame step hidden states ({name})", h1, h0, 1e-4)
    print(f"{'sampled ' if sampled else ''}frame step: codes identical")


if __name__ == "__main__":
    # argv: a folder for the tiny checkpoint, then the part: "kernels" (each kernel against torch), "step" (a
    # four-row frame step), "sampled-step" (the same with sampled rows) or "one-row" (a one-row frame step); one
    # subprocess each keeps each under its timeout
    torch.manual_seed(0)
    dkm.CUBLAS_MIN_ROWS = 1 << 20  # the Triton GEMM, unless a case says otherwise
    part = sys.argv[2]
    if part == "kernels":
        linear_cases()
        cublas_cases()
        attention_cases()
        choose_commit_cases()
        sampling_cases()
    else:
        ckpt = str(build_tiny_checkpoint(sys.argv[1], "custom_voice"))
        if part == "one-row":
            one_row_case(ckpt)
        else:
            frame_step_case(ckpt, sampled=part == "sampled-step")
    print("ok")
