//! Synthetic dumps for the comparator's tests: a small Llama-shaped "model" whose values
//! are seeded random tensors named like loupe's graph, written with `DumpWriter`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use loupe_formats::zip_archive::write_zip;
use loupe_parity::{compare, CompareOptions, DumpStyle, DumpWriter, NoProgress, Report};

pub const T: usize = 6;
pub const D: usize = 16;
pub const V: usize = 32;
pub const LAYERS: usize = 4;

/// SplitMix64 with Box-Muller normals.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        let mut g = loupe_core::SplitMix64(self.0);
        let v = g.next_u64();
        self.0 = g.0;
        v
    }
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    pub fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.normal()).collect()
    }
}

/// One named tensor.
#[derive(Debug, Clone)]
pub struct Named {
    pub name: String,
    pub step: u32,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// The sub-values of one layer, in execution order.
pub const LAYER_OPS: &[&str] = &[
    "input_layernorm",
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.q_rope",
    "self_attn.k_rope",
    "self_attn.attn_output",
    "self_attn.o_proj",
    "attn_residual",
    "post_attention_layernorm",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.act_fn",
    "mlp.act_mul",
    "mlp.down_proj",
];

/// A reference "model run": every value a loupe dump holds, at `step`.
pub fn model(seed: u64, step: u32) -> Vec<Named> {
    let mut rng = Rng(seed);
    let mut out = Vec::new();
    let mut push = |name: String, shape: Vec<usize>, rng: &mut Rng| {
        let n = shape.iter().product();
        out.push(Named { name, step, shape, data: rng.vec(n) });
    };
    push("model.embed_tokens".into(), vec![T, D], &mut rng);
    for l in 0..LAYERS {
        for op in LAYER_OPS {
            push(format!("model.layers.{l}.{op}"), vec![T, D], &mut rng);
        }
        push(format!("model.layers.{l}"), vec![T, D], &mut rng);
    }
    push("model.norm".into(), vec![T, D], &mut rng);
    push("lm_head".into(), vec![T, V], &mut rng);
    out
}

pub fn get<'a>(m: &'a mut [Named], name: &str) -> &'a mut Named {
    m.iter_mut().find(|t| t.name == name).unwrap_or_else(|| panic!("no tensor {name}"))
}

/// Writes a dump of `tensors` to `dir`.
pub fn write(dir: &Path, engine: &str, tensors: &[Named], prompt_tokens: Option<Vec<i64>>) -> PathBuf {
    write_style(dir, engine, tensors, prompt_tokens, DumpStyle::Npy)
}

pub fn write_style(
    dir: &Path,
    engine: &str,
    tensors: &[Named],
    prompt_tokens: Option<Vec<i64>>,
    style: DumpStyle,
) -> PathBuf {
    let mut w = DumpWriter::create(dir, engine, style).expect("create dump");
    w.manifest.prompt_tokens = prompt_tokens;
    for t in tensors {
        w.add(&t.name, t.step, &t.shape, &t.data).expect("add tensor");
    }
    w.finish().expect("finish dump")
}

/// Compares reference `a` with target `b` under default options.
pub fn run(a: &[Named], b: &[Named]) -> Report {
    run_with(a, b, &CompareOptions::default())
}

pub fn run_with(a: &[Named], b: &[Named], opts: &CompareOptions) -> Report {
    let dir = tempfile::tempdir().expect("temp dir");
    let pa = write(&dir.path().join("ref"), "transformers", a, Some(vec![1, 2, 3]));
    let pb = write(&dir.path().join("tgt"), "loupe", b, Some(vec![1, 2, 3]));
    compare(&pa, &pb, opts, &mut NoProgress).expect("compare")
}

/// Adds `scale` x standard-normal noise to rows `rows` of a tensor.
pub fn perturb_rows(t: &mut Named, rows: std::ops::Range<usize>, scale: f32, seed: u64) {
    let mut rng = Rng(seed);
    let cols = t.shape[1..].iter().product::<usize>();
    for r in rows {
        for v in &mut t.data[r * cols..(r + 1) * cols] {
            *v += scale * rng.normal();
        }
    }
}

pub fn signature(r: &Report) -> &str {
    r.verdict.signature.as_ref().map_or("none", |s| s.id)
}

/// A `torch.save`d f32 tensor of `shape`, assembled from the opcodes torch 2.x writes.
pub fn pt_bytes(shape: &[usize], data: &[f32]) -> Vec<u8> {
    let ints = |v: &[usize]| {
        let mut p = vec![b'('];
        for &x in v {
            p.push(b'J');
            p.extend_from_slice(&(x as i32).to_le_bytes());
        }
        p.push(b't');
        p
    };
    let mut strides = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    let mut p = vec![0x80, 2];
    p.extend_from_slice(b"ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuJ");
    p.extend_from_slice(&(data.len() as i32).to_le_bytes());
    p.extend_from_slice(b"tQK\x00");
    p.extend(ints(shape));
    p.extend(ints(&strides));
    p.extend_from_slice(b"\x89ccollections\nOrderedDict\n)RtR.");
    let raw: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    write_zip(&[
        ("archive/data.pkl", &p, false),
        ("archive/byteorder", b"little", false),
        ("archive/data/0", &raw, false),
    ])
    .expect("zip")
}

/// Writes `tensors` the way MAX's PyTorch-side hooks do: per step a folder of
/// `{name}-output.pt` files (with a leading batch dim of 1) and `tensor_names.txt` listing
/// them in execution order.
pub fn write_max_torch_dir(dir: &Path, tensors: &[Named]) -> PathBuf {
    let mut names: std::collections::BTreeMap<u32, String> = std::collections::BTreeMap::new();
    for t in tensors {
        let folder = dir.join(t.step.to_string());
        std::fs::create_dir_all(&folder).expect("dir");
        let label = format!("{}-output", t.name);
        let mut shape = vec![1];
        shape.extend(&t.shape);
        std::fs::write(folder.join(format!("{label}.pt")), pt_bytes(&shape, &t.data)).expect("pt");
        let list = names.entry(t.step).or_default();
        list.push_str(&label);
        list.push('\n');
    }
    for (step, list) in names {
        std::fs::write(dir.join(step.to_string()).join("tensor_names.txt"), list).expect("names");
    }
    dir.to_path_buf()
}
