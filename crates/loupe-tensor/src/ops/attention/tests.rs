use super::rows::{attend_heads, axpy, axpy_cached, dot, dot_cached, dot_scalar, HeadRow};
use half::f16;

use super::*;

#[test]
fn first_token_attends_only_to_itself() {
    // token-0 invariant: the output of token 0 is V[0] whatever q and k are.
    let shape = AttentionShape { n_heads: 2, n_kv_heads: 1, head_dim: 2, scale: 0.7, softcap: None };
    let q = [1.0, 2.0, 3.0, 4.0, 0.5, 0.5, -1.0, 1.0];
    let k = [0.3, 0.1, 0.9, -0.2];
    let v = [5.0, 6.0, 7.0, 8.0];
    let mut out = [0.0; 8];
    let mut probs = [0.0; 2 * 2 * 2];
    causal_attention(shape, &q, &k, &v, 2, &mut out, Some(&mut probs)).unwrap();
    assert_eq!(&out[..4], &[5.0, 6.0, 5.0, 6.0]);
    assert_eq!(probs[1], 0.0); // masked
    for h in 0..2 {
        let row = &probs[h * 4 + 2..h * 4 + 4];
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }
}

#[test]
fn variants_change_head_map_and_mask() {
    // 4 query heads over 2 kv heads of dim 1; two tokens. v of kv head 0 is 10+pos,
    // of kv head 1 is 20+pos; all scores equal, so outputs are means of visible v.
    let shape = AttentionShape { n_heads: 4, n_kv_heads: 2, head_dim: 1, scale: 1.0, softcap: None };
    let q = [0.0; 8];
    let k = [0.0; 4];
    let v = [10.0, 20.0, 11.0, 21.0];
    let run = |variant: AttentionVariant| {
        let mut out = [0.0f32; 8];
        attention(shape, variant, &q, &k, &v, 2, &mut out, None).unwrap();
        out
    };
    let grouped = run(AttentionVariant::default());
    assert_eq!(&grouped[..4], &[10.0, 10.0, 20.0, 20.0]);
    let modulo = run(AttentionVariant { head_map: HeadMap::Modulo, ..Default::default() });
    assert_eq!(&modulo[..4], &[10.0, 20.0, 10.0, 20.0]);
    let open = run(AttentionVariant { mask: AttentionMask::None, ..Default::default() });
    // token 0 now also sees token 1
    assert_eq!(&open[..4], &[10.5, 10.5, 20.5, 20.5]);
    assert_eq!(&open[4..], &grouped[4..]);
}

#[test]
fn simd_dot_and_axpy_match_scalar() {
    for n in [1, 15, 16, 64, 100, 128] {
        let a: Vec<f32> = (0..n).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.13).collect();
        let b: Vec<f32> = (0..n).map(|i| ((i * 53 % 7) as f32 - 3.0) * 0.29).collect();
        let want = dot_scalar(&a, &b);
        for isa in Isa::available() {
            let got = dot(isa, &a, &b);
            assert!((got - want).abs() <= 1e-5 * (1.0 + want.abs()), "{isa:?} n={n}: {got} vs {want}");
            let mut y = b.clone();
            axpy(isa, 0.75, &a, &mut y);
            for i in 0..n {
                assert!((y[i] - (b[i] + 0.75 * a[i])).abs() <= 1e-6, "{isa:?} n={n} i={i}");
            }
        }
    }
}

#[test]
fn prefill_in_chunks_equals_token_by_token_decode() {
    // 70 tokens spans three query chunks; the result must match running the same
    // queries one at a time over a growing context, with and without probs.
    let shape = AttentionShape { n_heads: 4, n_kv_heads: 2, head_dim: 16, scale: 0.25, softcap: None };
    let tokens = 70;
    let gen = |n: usize, seed: usize| -> Vec<f32> { crate::testing::uniform(n, seed as u64, -1.0, 1.0) };
    let q = gen(tokens * 64, 1);
    let k = gen(tokens * 32, 2);
    let v = gen(tokens * 32, 3);
    let mut out = vec![0.0; tokens * 64];
    let mut probs = vec![0.0; 4 * tokens * tokens];
    causal_attention(shape, &q, &k, &v, tokens, &mut out, Some(&mut probs)).unwrap();
    let mut out_np = vec![0.0; tokens * 64];
    causal_attention(shape, &q, &k, &v, tokens, &mut out_np, None).unwrap();
    assert_eq!(out, out_np);
    for t in 0..tokens {
        let mut o = vec![0.0; 64];
        causal_attention(shape, &q[t * 64..(t + 1) * 64], &k[..(t + 1) * 32], &v[..(t + 1) * 32], t + 1, &mut o, None)
            .unwrap();
        // Prefill runs matrix products, decode one dot per key: same math, other
        // summation order.
        for (a, b) in out[t * 64..(t + 1) * 64].iter().zip(&o) {
            assert!((a - b).abs() <= 1e-5, "token {t}: {a} vs {b}");
        }
    }
}

/// Straightforward f64 attention over any variant.
fn naive(shape: AttentionShape, variant: AttentionVariant, q: &[f32], k: &[f32], v: &[f32], ctx: usize) -> Vec<f64> {
    let AttentionShape { n_heads, n_kv_heads, head_dim, scale, softcap } = shape;
    let tokens = q.len() / (n_heads * head_dim);
    let (qw, kw) = (n_heads * head_dim, n_kv_heads * head_dim);
    let mut out = vec![0.0; q.len()];
    for h in 0..n_heads {
        let kh = match variant.head_map {
            HeadMap::Grouped => h / (n_heads / n_kv_heads),
            HeadMap::Modulo => h % n_kv_heads,
        };
        for t in 0..tokens {
            let pos = ctx - tokens + t;
            // Written as the masks' definitions, not through AttentionMask::visible.
            let keys: Vec<usize> = (0..ctx)
                .filter(|&j| match variant.mask {
                    AttentionMask::Causal => j <= pos,
                    AttentionMask::None => true,
                    AttentionMask::SlidingWindow(w) => j <= pos && pos - j < w,
                })
                .collect();
            let s: Vec<f64> = keys
                .iter()
                .map(|&j| {
                    (0..head_dim)
                        .map(|d| q[t * qw + h * head_dim + d] as f64 * k[j * kw + kh * head_dim + d] as f64)
                        .sum::<f64>()
                        * scale as f64
                })
                .collect();
            // Soft-capping as `eager_attention_forward` writes it, before the mask.
            let s: Vec<f64> = s.into_iter().map(|x| softcap.map_or(x, |c| c as f64 * (x / c as f64).tanh())).collect();
            let max = s.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
            let z: f64 = e.iter().sum();
            for d in 0..head_dim {
                out[t * qw + h * head_dim + d] =
                    keys.iter().zip(&e).map(|(&j, e)| e / z * v[j * kw + kh * head_dim + d] as f64).sum();
            }
        }
    }
    out
}

#[test]
fn prefill_and_decode_paths_match_a_naive_reference_for_every_variant() {
    let plain = AttentionShape { n_heads: 4, n_kv_heads: 2, head_dim: 16, scale: 0.25, softcap: None };
    // Scores up to about +-8 soft-capped at 2 (Gemma 2's attn_logit_softcapping): the cap
    // bites on most keys.
    let capped = AttentionShape { scale: 1.5, softcap: Some(2.0), ..plain };
    let gen = |n: usize, seed: usize| -> Vec<f32> { crate::testing::uniform(n, seed as u64, -1.0, 1.0) };
    // Qwen2.5-0.5B's group of 7 query heads per kv head, which decode splits into 4 + 3.
    let wide = AttentionShape { n_heads: 14, ..plain };
    for (shape, head_map) in [
        (plain, HeadMap::Grouped),
        (plain, HeadMap::Modulo),
        (capped, HeadMap::Grouped),
        (wide, HeadMap::Grouped),
        (wide, HeadMap::Modulo),
    ] {
        let (q_width, kv_width) = (shape.n_heads * shape.head_dim, shape.n_kv_heads * shape.head_dim);
        // Windows shorter than the context, longer than the call, and wider than it all.
        for mask in [
            AttentionMask::Causal,
            AttentionMask::None,
            AttentionMask::SlidingWindow(1),
            AttentionMask::SlidingWindow(7),
            AttentionMask::SlidingWindow(64),
        ] {
            let variant = AttentionVariant { head_map, mask };
            // 40 new tokens after 5 cached (prefill path), and 1 after 44 (decode).
            for (tokens, ctx) in [(40, 45), (1, 45)] {
                let q = gen(tokens * q_width, 7);
                let k = gen(ctx * kv_width, 8);
                let v = gen(ctx * kv_width, 9);
                let mut out = vec![0.0; tokens * q_width];
                attention(shape, variant, &q, &k, &v, ctx, &mut out, None).unwrap();
                let want = naive(shape, variant, &q, &k, &v, ctx);
                for (i, (a, b)) in out.iter().zip(&want).enumerate() {
                    assert!((*a as f64 - b).abs() < 1e-5, "{shape:?} {variant:?} tokens {tokens} [{i}]: {a} vs {b}");
                }
                if shape.softcap.is_some() && mask != AttentionMask::SlidingWindow(1) {
                    // The cap is seen: without it the same scores give another output
                    // (except over one key, whose probability is 1 whatever its score).
                    let uncapped = naive(AttentionShape { softcap: None, ..shape }, variant, &q, &k, &v, ctx);
                    let diff = want.iter().zip(&uncapped).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
                    assert!(diff > 1e-2, "{variant:?} tokens {tokens}: the soft-cap changes the output by only {diff}");
                }
            }
        }
    }
}

/// An FP8 cache (E4M3, a scale per row) gives exactly the attention of its rows widened
/// to f32, decode and prefill (under the active ISA; CI runs every one via LOUPE_ISA).
#[test]
fn an_fp8_cache_gives_the_bits_of_its_rows_widened_to_f32() {
    let gen = |n: usize, seed: usize| -> Vec<f32> { crate::testing::uniform(n, seed as u64, -5.0, 5.0) };
    for head_dim in [64, 24, 7] {
        let shape = AttentionShape { n_heads: 4, n_kv_heads: 2, head_dim, scale: 0.25, softcap: None };
        let (qw, kw) = (4 * head_dim, 2 * head_dim);
        for (tokens, ctx) in [(1, 45), (3, 45), (40, 45)] {
            let q = gen(tokens * qw, 1);
            let quant = |x: Vec<f32>| {
                let (mut c, mut s) = (vec![0u8; x.len()], vec![0f32; x.len() / kw]);
                crate::fp8::quantize_rows_e4m3(&x, kw, &mut c, &mut s).unwrap();
                (c, s)
            };
            let ((kc, ks), (vc, vs)) = (quant(gen(ctx * kw, 2)), quant(gen(ctx * kw, 3)));
            let (kb, vb) = (
                KvBlocks::Fp8 { codes: &kc, scales: &ks, group: kw },
                KvBlocks::Fp8 { codes: &vc, scales: &vs, group: kw },
            );
            let (k, v) = (kb.to_f32_vec(), vb.to_f32_vec());
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            let mut want = vec![0.0; tokens * qw];
            attention(shape, AttentionVariant::default(), &q, &k, &v, ctx, &mut want, None).unwrap();
            let mut got = vec![0.0; tokens * qw];
            attention_cached(shape, AttentionVariant::default(), &q, kb, vb, ctx, &mut got, None).unwrap();
            assert_eq!(bits(&got), bits(&want), "head_dim {head_dim}, {tokens} tokens");
        }
    }
}

#[test]
fn an_f16_cache_gives_the_bits_of_its_rows_widened_to_f32() {
    let gen = |n: usize, seed: usize| -> Vec<f32> { crate::testing::uniform(n, seed as u64, -1.0, 1.0) };
    // head_dim 64 (whole vectors), 24 (an AVX-512 tail) and 7 (scalar only).
    for head_dim in [64, 24, 7] {
        let shape = AttentionShape { n_heads: 4, n_kv_heads: 2, head_dim, scale: 0.25, softcap: None };
        let (qw, kw) = (4 * head_dim, 2 * head_dim);
        // Decode (1 and 3 tokens: one dot per key) and prefill (40 and 70 tokens: the
        // tile kernels, whose key transposition widens f16 keys itself, in tasks of 64
        // keys, or gemm on widened rows), after 5 and 80 cached positions.
        for (tokens, ctx) in [(1, 45), (3, 45), (40, 45), (70, 150)] {
            let q = gen(tokens * qw, 1);
            let k16: Vec<f16> = gen(ctx * kw, 2).iter().map(|&x| f16::from_f32(x)).collect();
            let v16: Vec<f16> = gen(ctx * kw, 3).iter().map(|&x| f16::from_f32(x)).collect();
            let (k, v): (Vec<f32>, Vec<f32>) =
                (k16.iter().map(|x| x.to_f32()).collect(), v16.iter().map(|x| x.to_f32()).collect());
            for with_probs in [false, true] {
                let mut want = vec![0.0; tokens * qw];
                let mut want_p = vec![0.0; 4 * tokens * ctx];
                attention(
                    shape,
                    AttentionVariant::default(),
                    &q,
                    &k,
                    &v,
                    ctx,
                    &mut want,
                    with_probs.then_some(&mut want_p[..]),
                )
                .unwrap();
                let mut got = vec![0.0; tokens * qw];
                let mut got_p = vec![0.0; 4 * tokens * ctx];
                let (kb, vb) = (KvBlocks::F16(&k16), KvBlocks::F16(&v16));
                attention_cached(
                    shape,
                    AttentionVariant::default(),
                    &q,
                    kb,
                    vb,
                    ctx,
                    &mut got,
                    with_probs.then_some(&mut got_p[..]),
                )
                .unwrap();
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "head_dim {head_dim}, {tokens} tokens, probs {with_probs}");
                assert_eq!(bits(&got_p), bits(&want_p), "head_dim {head_dim}, {tokens} tokens");
                // Mixed: f16 keys, f32 values.
                attention_cached(
                    shape,
                    AttentionVariant::default(),
                    &q,
                    KvBlocks::F16(&k16),
                    KvBlocks::F32(&v),
                    ctx,
                    &mut got,
                    None,
                )
                .unwrap();
                assert_eq!(bits(&got), bits(&want), "mixed, head_dim {head_dim}, {tokens} tokens");
            }
        }
    }
    // Too few cached rows is an error, not a panic.
    let shape = AttentionShape { n_heads: 2, n_kv_heads: 1, head_dim: 4, scale: 1.0, softcap: None };
    let short = vec![f16::ZERO; 4];
    let mut out = [0.0; 8];
    assert!(attention_cached(
        shape,
        AttentionVariant::default(),
        &[0.0; 8],
        KvBlocks::F16(&short),
        KvBlocks::F16(&short),
        2,
        &mut out,
        None
    )
    .is_err());
}

/// The row kernels give the bits of the per-key dot / axpy loop on every ISA, f32 and
/// f16 rows, whole-vector head sizes and others (which take the per-key loop), rows out
/// of order (paged) and windows that start past 0.
#[test]
fn row_kernels_give_the_bits_of_the_per_key_loop() {
    let gen = |n: usize, seed: usize| -> Vec<f32> { crate::testing::uniform(n, seed as u64, -2.0, 2.0) };
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for head_dim in [8, 16, 24, 64, 80, 256, 7] {
        let ctx = 37;
        let q = gen(head_dim, 1);
        let (k, v) = (gen(ctx * head_dim, 2), gen(ctx * head_dim, 3));
        let (k16, v16): (Vec<f16>, Vec<f16>) =
            (k.iter().map(|&x| f16::from_f32(x)).collect(), v.iter().map(|&x| f16::from_f32(x)).collect());
        // Position p's row is stored at slot (p * 11) % ctx, as a block table scatters them.
        let start_of = |p: usize| (p * 11 % ctx) * head_dim;
        for (keys, values) in [
            (KvBlocks::F32(&k), KvBlocks::F32(&v)),
            (KvBlocks::F16(&k16), KvBlocks::F16(&v16)),
            (KvBlocks::F16(&k16), KvBlocks::F32(&v)),
        ] {
            for visible in [0..ctx, 5..ctx, 36..37] {
                for isa in Isa::available() {
                    let mut wide = vec![0f32; head_dim];
                    let mut want_s = vec![0f32; ctx];
                    for j in visible.clone() {
                        want_s[j] = dot_cached(isa, &q, &keys, start_of(j), &mut wide);
                    }
                    softmax_row(&mut want_s[visible.clone()], 0.3, None);
                    let mut want_o = vec![0f32; head_dim];
                    for j in visible.clone() {
                        axpy_cached(isa, want_s[j], &values, start_of(j), &mut wide, &mut want_o);
                    }
                    let (mut got_s, mut got_o) = (vec![0f32; ctx], vec![f32::NAN; head_dim]);
                    let rows = CachedRows { keys: &keys, values: &values, start_of };
                    let mut head = [HeadRow { q: &q, scores: &mut got_s, o: &mut got_o }];
                    attend_heads(isa, &mut head, &rows, visible.clone(), 0.3, None, &mut wide);
                    assert_eq!(bits(&got_s), bits(&want_s), "{isa:?} head_dim {head_dim} {visible:?} scores");
                    assert_eq!(bits(&got_o), bits(&want_o), "{isa:?} head_dim {head_dim} {visible:?} output");
                }
            }
        }
    }
}

/// Heads that share cached rows, run together (1 to 7 heads: one kernel call and split
/// ones), give each head the bits of that head run alone, on every ISA, f32 and f16 rows,
/// whole-vector head sizes and others, windows that start past 0.
#[test]
fn grouped_heads_give_the_bits_of_each_head_alone() {
    let gen = |n: usize, seed: usize| -> Vec<f32> { crate::testing::uniform(n, seed as u64, -2.0, 2.0) };
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for head_dim in [16, 64, 128, 24] {
        let ctx = 29;
        let (k, v) = (gen(ctx * head_dim, 2), gen(ctx * head_dim, 3));
        let k16: Vec<f16> = k.iter().map(|&x| f16::from_f32(x)).collect();
        let start_of = |p: usize| (p * 7 % ctx) * head_dim;
        for (keys, values) in [(KvBlocks::F32(&k), KvBlocks::F32(&v)), (KvBlocks::F16(&k16), KvBlocks::F32(&v))] {
            let rows = CachedRows { keys: &keys, values: &values, start_of };
            for n_heads in 1..=7 {
                let qs: Vec<Vec<f32>> = (0..n_heads).map(|h| gen(head_dim, 10 + h)).collect();
                for visible in [0..ctx, 4..ctx] {
                    for isa in Isa::available() {
                        let mut wide = vec![0f32; head_dim];
                        let mut scores = vec![vec![0f32; ctx]; n_heads];
                        let mut outs = vec![vec![f32::NAN; head_dim]; n_heads];
                        let mut heads: Vec<HeadRow<'_>> = qs
                            .iter()
                            .zip(scores.iter_mut())
                            .zip(outs.iter_mut())
                            .map(|((q, scores), o)| HeadRow { q, scores, o })
                            .collect();
                        attend_heads(isa, &mut heads, &rows, visible.clone(), 0.3, Some(4.0), &mut wide);
                        for (h, q) in qs.iter().enumerate() {
                            let (mut want_s, mut want_o) = (vec![0f32; ctx], vec![f32::NAN; head_dim]);
                            let mut alone = [HeadRow { q, scores: &mut want_s, o: &mut want_o }];
                            attend_heads(isa, &mut alone, &rows, visible.clone(), 0.3, Some(4.0), &mut wide);
                            let what = format!("{isa:?} head_dim {head_dim} head {h} of {n_heads} {visible:?}");
                            assert_eq!(bits(&scores[h]), bits(&want_s), "{what} scores");
                            assert_eq!(bits(&outs[h]), bits(&want_o), "{what} output");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn rejects_bad_grouping() {
    let shape = AttentionShape { n_heads: 3, n_kv_heads: 2, head_dim: 2, scale: 1.0, softcap: None };
    let mut out = [0.0; 6];
    assert!(causal_attention(shape, &[0.0; 6], &[0.0; 4], &[0.0; 4], 1, &mut out, None).is_err());
}
