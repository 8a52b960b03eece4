//! The values the decoder builder emits, as data: each value's role (which module of the
//! decoder computes it), its name (the Hugging Face module path, ARCHITECTURE.md's first
//! invariant) and the values it is computed from. [`crate::decoder`] names its values through
//! [`Module::name`], so tools that reason about a model's values (`loupe explain`) ask here
//! instead of spelling module paths themselves.

use std::fmt;

/// What a value of the decoder graph is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModuleRole {
    /// `model.embed_tokens`.
    Embedding,
    /// `model.layers.N.input_layernorm`.
    InputNorm,
    QProj,
    KProj,
    VProj,
    /// Phi-3's fused q/k/v projection (`self_attn.qkv_proj`): one matmul whose rows are q's,
    /// then k's, then v's. Only in families with fused projections, which have no
    /// `q_proj`/`k_proj`/`v_proj`.
    QkvProj,
    /// The q columns of `qkv_proj`'s output (`self_attn.qkv_proj.q`; no module computes it).
    QPart,
    /// The k columns of `qkv_proj`'s output (`self_attn.qkv_proj.k`).
    KPart,
    /// The v columns of `qkv_proj`'s output (`self_attn.qkv_proj.v`).
    VPart,
    /// The per-head RMSNorm of q before RoPE (`self_attn.q_norm`; Qwen3, Gemma 3). Only in
    /// families with q/k norms.
    QNorm,
    /// The per-head RMSNorm of k (`self_attn.k_norm`).
    KNorm,
    /// q after the rotary embedding (`self_attn.q_rope`).
    QRope,
    KRope,
    /// The per-head RMSNorm of q after RoPE (`self_attn.query_layernorm`; Hunyuan), which
    /// attention reads. Only in families with post-RoPE q/k norms.
    QLayerNorm,
    /// The per-head RMSNorm of k after RoPE (`self_attn.key_layernorm`).
    KLayerNorm,
    /// Attention's output before `o_proj` (`self_attn.attn_output`).
    AttnCore,
    /// Attention probabilities, a side output of [`AttnCore`](Self::AttnCore)'s node.
    AttnProbs,
    OProj,
    /// The attention block's output: an alias of [`OProj`](Self::OProj) (`self_attn`).
    SelfAttn,
    /// The residual sum after attention (`attn_residual`).
    AttnResidual,
    /// `post_attention_layernorm`: the MLP's input norm in Llama-style layers; in layers
    /// with sandwich norms (Gemma), the norm of attention's output before the residual add.
    PostAttnNorm,
    /// `pre_feedforward_layernorm`: the MLP's input norm (sandwich-norm layers only).
    PreFfnNorm,
    Gate,
    Up,
    /// Phi-3's fused gate/up projection (`mlp.gate_up_proj`): gate rows, then up rows.
    GateUpProj,
    /// The first half of `gate_up_proj`'s output (`mlp.gate_up_proj.gate`; `chunk(2)`'s first).
    GatePart,
    /// The second half (`mlp.gate_up_proj.up`).
    UpPart,
    /// The activation of `gate_proj` (`mlp.act_fn`).
    ActFn,
    /// The activation of the gate part in Phi-3's MLP, whose module is `mlp.activation_fn`.
    ActivationFn,
    /// `act_fn(gate) * up` (`mlp.act_mul`).
    ActMul,
    Down,
    /// The MLP block's output: an alias of [`Down`](Self::Down) (`mlp`).
    Mlp,
    /// `post_feedforward_layernorm`: the norm of the MLP's output before the residual add
    /// (sandwich-norm layers only).
    PostFfnNorm,
    /// The decoder layer's output (`model.layers.N`).
    LayerOutput,
    /// `model.norm`.
    FinalNorm,
    /// `lm_head`: the logits (before any final soft-capping).
    LmHead,
    /// The MoE router's logits (`mlp.gate`, a linear without bias; its forward returns
    /// `(router_logits, weights, indices)` and hooks see the logits). MoE layers only.
    /// Where the linear is a submodule of its own ([`RouterWg`](Self::RouterWg)), an alias of it.
    Router,
    /// Hunyuan's router linear, `mlp.gate.wg`, inside the gate module `mlp.gate`.
    RouterWg,
    /// The experts each token goes to, ascending ids as f32 (`mlp.gate.top_k_index`).
    RouterIndices,
    /// Their weights (`mlp.gate.top_k_weights`).
    RouterWeights,
    /// The routed experts' weighted sum (`mlp.experts`).
    Experts,
    /// The shared experts' MLP (`mlp.shared_experts.*`; GLM-4-MoE), a SwiGLU MLP run on
    /// every token of a MoE layer.
    SharedGate,
    SharedUp,
    SharedActFn,
    SharedActMul,
    SharedDown,
    /// The shared experts' output: an alias of [`SharedDown`](Self::SharedDown).
    SharedExperts,
    /// Hunyuan's shared expert, `mlp.shared_mlp.*` (`HunYuanMoEV1MLP`): the same SwiGLU MLP
    /// as [`SharedGate`](Self::SharedGate)..., under its own module name.
    SharedMlpGate,
    SharedMlpUp,
    SharedMlpActFn,
    SharedMlpActMul,
    SharedMlpDown,
    /// The shared MLP's output: an alias of [`SharedMlpDown`](Self::SharedMlpDown).
    SharedMlp,
    /// `logits`: `lm_head`'s output soft-capped (`final_logit_softcapping`, Gemma 2), the
    /// model output's `logits` field. Only in models with a final soft-cap.
    Logits,
}

use ModuleRole::*;

impl ModuleRole {
    /// Every role, in the order the builder emits them (per layer for the layer roles).
    pub const ALL: [ModuleRole; 54] = [
        Embedding,
        InputNorm,
        QProj,
        KProj,
        VProj,
        QkvProj,
        QPart,
        KPart,
        VPart,
        QNorm,
        KNorm,
        QRope,
        KRope,
        QLayerNorm,
        KLayerNorm,
        AttnCore,
        AttnProbs,
        OProj,
        SelfAttn,
        AttnResidual,
        PostAttnNorm,
        PreFfnNorm,
        Gate,
        Up,
        GateUpProj,
        GatePart,
        UpPart,
        ActFn,
        ActivationFn,
        ActMul,
        Down,
        RouterWg,
        Router,
        RouterIndices,
        RouterWeights,
        Experts,
        SharedGate,
        SharedUp,
        SharedActFn,
        SharedActMul,
        SharedDown,
        SharedExperts,
        SharedMlpGate,
        SharedMlpUp,
        SharedMlpActFn,
        SharedMlpActMul,
        SharedMlpDown,
        SharedMlp,
        Mlp,
        PostFfnNorm,
        LayerOutput,
        FinalNorm,
        LmHead,
        Logits,
    ];

    /// Whether the role belongs to a decoder layer (its name carries the layer index).
    pub fn in_layer(self) -> bool {
        !matches!(self, Embedding | FinalNorm | LmHead | Logits)
    }

    /// The name's part after `model.layers.N.` for layer roles (empty for the layer
    /// output), the whole name for model-level roles.
    pub fn path(self) -> &'static str {
        match self {
            Embedding => "model.embed_tokens",
            InputNorm => "input_layernorm",
            QProj => "self_attn.q_proj",
            KProj => "self_attn.k_proj",
            VProj => "self_attn.v_proj",
            QkvProj => "self_attn.qkv_proj",
            QPart => "self_attn.qkv_proj.q",
            KPart => "self_attn.qkv_proj.k",
            VPart => "self_attn.qkv_proj.v",
            QNorm => "self_attn.q_norm",
            KNorm => "self_attn.k_norm",
            QRope => "self_attn.q_rope",
            KRope => "self_attn.k_rope",
            QLayerNorm => "self_attn.query_layernorm",
            KLayerNorm => "self_attn.key_layernorm",
            AttnCore => "self_attn.attn_output",
            AttnProbs => "self_attn.attn_probs",
            OProj => "self_attn.o_proj",
            SelfAttn => "self_attn",
            AttnResidual => "attn_residual",
            PostAttnNorm => "post_attention_layernorm",
            PreFfnNorm => "pre_feedforward_layernorm",
            PostFfnNorm => "post_feedforward_layernorm",
            Gate => "mlp.gate_proj",
            Up => "mlp.up_proj",
            GateUpProj => "mlp.gate_up_proj",
            GatePart => "mlp.gate_up_proj.gate",
            UpPart => "mlp.gate_up_proj.up",
            ActFn => "mlp.act_fn",
            ActivationFn => "mlp.activation_fn",
            ActMul => "mlp.act_mul",
            Down => "mlp.down_proj",
            Mlp => "mlp",
            Router => "mlp.gate",
            RouterWg => "mlp.gate.wg",
            RouterIndices => "mlp.gate.top_k_index",
            RouterWeights => "mlp.gate.top_k_weights",
            Experts => "mlp.experts",
            SharedGate => "mlp.shared_experts.gate_proj",
            SharedUp => "mlp.shared_experts.up_proj",
            SharedActFn => "mlp.shared_experts.act_fn",
            SharedActMul => "mlp.shared_experts.act_mul",
            SharedDown => "mlp.shared_experts.down_proj",
            SharedExperts => "mlp.shared_experts",
            SharedMlpGate => "mlp.shared_mlp.gate_proj",
            SharedMlpUp => "mlp.shared_mlp.up_proj",
            SharedMlpActFn => "mlp.shared_mlp.act_fn",
            SharedMlpActMul => "mlp.shared_mlp.act_mul",
            SharedMlpDown => "mlp.shared_mlp.down_proj",
            SharedMlp => "mlp.shared_mlp",
            LayerOutput => "",
            FinalNorm => "model.norm",
            LmHead => "lm_head",
            Logits => "logits",
        }
    }

    /// The role whose value this one is an alias of (`SelfAttn` → `OProj`, `Mlp` → `Down`)
    /// in a dense layer; MoE layers differ ([`Module::canonical_in`]).
    pub fn alias_of(self) -> Option<ModuleRole> {
        match self {
            SelfAttn => Some(OProj),
            Mlp => Some(Down),
            SharedExperts => Some(SharedDown),
            SharedMlp => Some(SharedMlpDown),
            _ => None,
        }
    }

    /// The roles that are aliases of this one (in a dense layer).
    pub fn aliases(self) -> &'static [ModuleRole] {
        match self {
            OProj => &[SelfAttn],
            Down => &[Mlp],
            SharedDown => &[SharedExperts],
            SharedMlpDown => &[SharedMlp],
            _ => &[],
        }
    }

    /// The role that computes the value (itself, or the role it is an alias of).
    pub fn canonical(self) -> ModuleRole {
        self.alias_of().unwrap_or(self)
    }

    /// Whether the value is a linear projection `x Wᵀ (+ b)` with the module's weight.
    pub fn is_linear(self) -> bool {
        matches!(
            self.canonical(),
            QProj
                | KProj
                | VProj
                | QkvProj
                | OProj
                | Gate
                | Up
                | GateUpProj
                | Down
                | LmHead
                | Router
                | RouterWg
                | SharedGate
                | SharedUp
                | SharedDown
                | SharedMlpGate
                | SharedMlpUp
                | SharedMlpDown
        )
    }

    /// Whether the value is an RMSNorm with the module's weight.
    pub fn is_norm(self) -> bool {
        matches!(
            self,
            InputNorm | QNorm | KNorm | QLayerNorm | KLayerNorm | PostAttnNorm | PreFfnNorm | PostFfnNorm | FinalNorm
        )
    }

    /// Whether only families with per-head q/k norms (before RoPE) emit the role.
    pub fn needs_qk_norm(self) -> bool {
        matches!(self, QNorm | KNorm)
    }

    /// Whether only families with per-head q/k norms after RoPE emit the role.
    pub fn needs_qk_norm_after_rope(self) -> bool {
        matches!(self, QLayerNorm | KLayerNorm)
    }

    /// Whether only families with sandwich norms emit the role.
    pub fn needs_sandwich_norms(self) -> bool {
        matches!(self, PreFfnNorm | PostFfnNorm)
    }

    /// Whether a column slice of a fused projection's output computes the value.
    pub fn is_part(self) -> bool {
        matches!(self, QPart | KPart | VPart | GatePart | UpPart)
    }

    /// Whether only families with fused q/k/v and gate/up projections emit the role.
    pub fn needs_fused_projections(self) -> bool {
        matches!(self, QkvProj | QPart | KPart | VPart | GateUpProj | GatePart | UpPart | ActivationFn)
    }

    /// Whether families with fused projections do not emit the role (their q/k/v and
    /// gate/up are parts of one matmul, and the activation module has another name).
    pub fn needs_separate_projections(self) -> bool {
        matches!(self, QProj | KProj | VProj | Gate | Up | ActFn)
    }

    /// Whether only models with a final soft-cap emit the role.
    pub fn needs_final_softcap(self) -> bool {
        self == Logits
    }

    /// Whether only MoE layers emit the role.
    pub fn moe_only(self) -> bool {
        matches!(self, Router | RouterWg | RouterIndices | RouterWeights | Experts) || self.shared_only()
    }

    /// Whether only MoE layers with shared experts emit the role.
    pub fn shared_only(self) -> bool {
        matches!(self, SharedGate | SharedUp | SharedActFn | SharedActMul | SharedDown | SharedExperts)
            || self.shared_mlp_only()
    }

    /// Whether only MoE layers whose shared expert is Hunyuan's `mlp.shared_mlp` emit the role.
    pub fn shared_mlp_only(self) -> bool {
        matches!(self, SharedMlpGate | SharedMlpUp | SharedMlpActFn | SharedMlpActMul | SharedMlpDown | SharedMlp)
    }

    /// Whether only dense layers emit the role (the dense MLP's values).
    pub fn dense_only(self) -> bool {
        matches!(self, Gate | Up | ActFn | ActMul | Down | GateUpProj | GatePart | UpPart | ActivationFn)
    }
}

/// The most decoder layers a MoE model's wiring describes ([`MoeWiring::sparse_layers`] is
/// a bit set); larger MoE configs are refused.
pub const MAX_MOE_LAYERS: usize = 128;

/// How a MoE model's layers are wired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MoeWiring {
    /// Bit `l` set: layer `l`'s MLP is sparse (router, experts); the others are dense.
    pub sparse_layers: u128,
    /// Sparse layers add shared experts to the routed output (GLM-4-MoE, Hunyuan); `mlp` is
    /// then their sum, otherwise an alias of `mlp.experts`.
    pub shared_experts: bool,
    /// The shared expert is `mlp.shared_mlp` (Hunyuan), not `mlp.shared_experts`.
    pub shared_mlp: bool,
    /// The router's linear is `mlp.gate.wg` (Hunyuan), of which `mlp.gate` is an alias.
    pub router_wg: bool,
}

impl MoeWiring {
    /// Whether layer `layer` is sparse.
    pub fn sparse(&self, layer: usize) -> bool {
        layer < MAX_MOE_LAYERS && self.sparse_layers >> layer & 1 == 1
    }
}

/// How a family's decoder layers are wired: which optional values they emit and what reads
/// what ([`Module::inputs_in`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Wiring {
    /// Per-head RMSNorms of q and k before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Per-head RMSNorms of q and k after RoPE, which attention reads (Hunyuan's
    /// `query_layernorm` / `key_layernorm`).
    pub qk_norm_after_rope: bool,
    /// Gemma's four norms per layer: attention's and the MLP's outputs are normalized
    /// before their residual adds, and the MLP reads `pre_feedforward_layernorm`.
    pub sandwich_norms: bool,
    /// `lm_head`'s output soft-capped into `logits` (Gemma 2's `final_logit_softcapping`).
    pub final_softcap: bool,
    /// MoE MLPs on some layers; `None`: every layer is dense.
    pub moe: Option<MoeWiring>,
    /// Phi-3's fused `qkv_proj` and `gate_up_proj`, each one matmul split into its parts.
    pub fused_projections: bool,
}

impl Wiring {
    /// Whether a model wired this way emits `role` (in a dense layer).
    pub fn emits(&self, role: ModuleRole) -> bool {
        self.projections_fit(role)
            && self.qk_norms_fit(role)
            && (self.sandwich_norms || !role.needs_sandwich_norms())
            && (self.final_softcap || !role.needs_final_softcap())
            && !role.moe_only()
    }

    /// Whether `role` belongs to this wiring's q/k norms (none, before or after RoPE).
    fn qk_norms_fit(&self, role: ModuleRole) -> bool {
        (self.qk_norm || !role.needs_qk_norm()) && (self.qk_norm_after_rope || !role.needs_qk_norm_after_rope())
    }

    /// Whether `role` belongs to this wiring's projections: separate q/k/v and gate/up, or
    /// Phi-3's fused ones and their parts.
    fn projections_fit(&self, role: ModuleRole) -> bool {
        if self.fused_projections {
            !role.needs_separate_projections()
        } else {
            !role.needs_fused_projections()
        }
    }

    /// Whether decoder layer `layer` is a sparse MoE layer.
    pub fn sparse(&self, layer: usize) -> bool {
        self.moe.is_some_and(|m| m.sparse(layer))
    }

    /// Whether layer `layer` of a model wired this way emits `role`.
    pub fn emits_at(&self, layer: usize, role: ModuleRole) -> bool {
        if !role.in_layer() || !self.sparse(layer) {
            return self.emits(role);
        }
        let moe = self.moe.unwrap_or_default();
        // The shared expert under one of its two module names.
        let shared_fits =
            if role.shared_only() { moe.shared_experts && moe.shared_mlp == role.shared_mlp_only() } else { true };
        self.projections_fit(role)
            && self.qk_norms_fit(role)
            && (self.sandwich_norms || !role.needs_sandwich_norms())
            && !role.dense_only()
            && shared_fits
            && (moe.router_wg || role != RouterWg)
    }
}

/// One value of the graph: a role, and the decoder layer for layer roles (`layer` is 0 and
/// ignored for model-level roles).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Module {
    pub role: ModuleRole,
    pub layer: usize,
}

impl Module {
    /// A value of decoder layer `layer`.
    pub fn layer(layer: usize, role: ModuleRole) -> Module {
        Module { role, layer: if role.in_layer() { layer } else { 0 } }
    }

    /// A model-level value (`Embedding`, `FinalNorm`, `LmHead`).
    pub fn model(role: ModuleRole) -> Module {
        Module { role, layer: 0 }
    }

    /// `model.layers.N` (for layer roles).
    pub fn layer_prefix(layer: usize) -> String {
        format!("model.layers.{layer}")
    }

    /// The value's name: the Hugging Face module path (plus a dotted suffix for values
    /// PyTorch has no module for).
    pub fn name(&self) -> String {
        match (self.role.in_layer(), self.role.path()) {
            (false, path) => path.to_string(),
            (true, "") => Module::layer_prefix(self.layer),
            (true, sub) => format!("{}.{sub}", Module::layer_prefix(self.layer)),
        }
    }

    /// The name of the module's parameter `param` (`weight`, `bias`); an alias names its
    /// module's (`…self_attn` → `…self_attn.o_proj.weight`).
    pub fn param(&self, param: &str) -> String {
        format!("{}.{param}", Module { role: self.role.canonical(), layer: self.layer }.name())
    }

    /// The value this one is an alias of, if any (in a dense layer).
    pub fn canonical(&self) -> Module {
        Module { role: self.role.canonical(), layer: self.layer }
    }

    /// This value's name and the names of its aliases (either may be in a dump), in a dense
    /// layer.
    pub fn names(&self) -> Vec<String> {
        let c = self.canonical();
        std::iter::once(c)
            .chain(c.role.aliases().iter().map(|&r| Module { role: r, layer: c.layer }))
            .map(|m| m.name())
            .collect()
    }

    /// [`canonical`](Self::canonical) in a model wired as `wiring` says: in a sparse layer
    /// `mlp` is `mlp.experts` (no shared experts) or a value of its own (their sum with the
    /// shared experts), and with [`MoeWiring::router_wg`] `mlp.gate` is `mlp.gate.wg`.
    pub fn canonical_in(&self, wiring: Wiring) -> Module {
        let moe = wiring.moe.unwrap_or_default();
        if self.role == Router && moe.router_wg && wiring.sparse(self.layer) {
            return Module { role: RouterWg, layer: self.layer };
        }
        if self.role == Mlp && wiring.sparse(self.layer) {
            let shared = wiring.moe.is_some_and(|m| m.shared_experts);
            return Module { role: if shared { Mlp } else { Experts }, layer: self.layer };
        }
        self.canonical()
    }

    /// [`names`](Self::names) in a model wired as `wiring` says.
    pub fn names_in(&self, wiring: Wiring) -> Vec<String> {
        let c = self.canonical_in(wiring);
        if c.role == RouterWg {
            return vec![c.name(), Module { role: Router, layer: c.layer }.name()];
        }
        if wiring.sparse(self.layer) && matches!(c.role, Experts | Mlp | Down) {
            let shared = wiring.moe.is_some_and(|m| m.shared_experts);
            return match (c.role, shared) {
                (Experts, false) => vec![c.name(), Module { role: Mlp, layer: c.layer }.name()],
                _ => vec![c.name()],
            };
        }
        self.names()
    }

    /// The value with this name, if the builder emits one by that name.
    pub fn parse(name: &str) -> Option<Module> {
        if let Some(rest) = name.strip_prefix("model.layers.") {
            let (num, sub) = rest.split_once('.').unwrap_or((rest, ""));
            // Digits only: `model.layers.+1` or `model.layers.01` are not names the builder emits.
            if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) || (num.len() > 1 && num.starts_with('0')) {
                return None;
            }
            let layer = num.parse().ok()?;
            let role = ModuleRole::ALL.into_iter().find(|r| r.in_layer() && r.path() == sub)?;
            return Some(Module { role, layer });
        }
        ModuleRole::ALL.into_iter().find(|r| !r.in_layer() && r.path() == name).map(Module::model)
    }

    /// The input of decoder layer `layer`: the previous layer's output, or the embeddings.
    pub fn layer_input(layer: usize) -> Module {
        match layer.checked_sub(1) {
            Some(prev) => Module::layer(prev, LayerOutput),
            None => Module::model(Embedding),
        }
    }

    /// The values this one is computed from, as the builder wires them (value inputs, not
    /// weights) in a family without q/k norms. `n_layers` is the number of decoder layers
    /// (the final norm reads the last).
    pub fn inputs(&self, n_layers: usize) -> Vec<Module> {
        self.inputs_in(n_layers, Wiring::default())
    }

    /// [`inputs`](Self::inputs) in a family wired as `wiring` says: with q/k norms RoPE reads
    /// the normed q/k, with norms after RoPE attention reads those; with sandwich norms the residual adds read the normed block outputs
    /// and the MLP reads `pre_feedforward_layernorm`.
    pub fn inputs_in(&self, n_layers: usize, wiring: Wiring) -> Vec<Module> {
        let Wiring {
            qk_norm,
            qk_norm_after_rope: post_rope,
            sandwich_norms: sandwich,
            final_softcap: _,
            moe,
            fused_projections: fused,
        } = wiring;
        let l = |role| Module::layer(self.layer, role);
        // q, k, v, gate and up: projections of their own, or parts of a fused one.
        let (q, k, v) = if fused { (QPart, KPart, VPart) } else { (QProj, KProj, VProj) };
        let (gate, up, act) = if fused { (GatePart, UpPart, ActivationFn) } else { (Gate, Up, ActFn) };
        // The MLP's input norm, and the value that is the MLP block's output.
        let mlp_in = l(if sandwich { PreFfnNorm } else { PostAttnNorm });
        let shared = moe.is_some_and(|m| m.shared_experts);
        let shared_down = if moe.is_some_and(|m| m.shared_mlp) { SharedMlpDown } else { SharedDown };
        let router = if moe.is_some_and(|m| m.router_wg) { RouterWg } else { Router };
        let mlp_out = if wiring.sparse(self.layer) { l(if shared { Mlp } else { Experts }) } else { l(Down) };
        match self.role {
            Embedding => vec![],
            InputNorm => vec![Module::layer_input(self.layer)],
            QProj | KProj | VProj | QkvProj => vec![l(InputNorm)],
            QPart | KPart | VPart => vec![l(QkvProj)],
            QNorm => vec![l(q)],
            KNorm => vec![l(k)],
            QRope => vec![l(if qk_norm { QNorm } else { q })],
            KRope => vec![l(if qk_norm { KNorm } else { k })],
            QLayerNorm => vec![l(QRope)],
            KLayerNorm => vec![l(KRope)],
            AttnCore | AttnProbs if post_rope => vec![l(QLayerNorm), l(KLayerNorm), l(v)],
            AttnCore | AttnProbs => vec![l(QRope), l(KRope), l(v)],
            OProj | SelfAttn => vec![l(AttnCore)],
            AttnResidual => vec![Module::layer_input(self.layer), l(if sandwich { PostAttnNorm } else { OProj })],
            PostAttnNorm => vec![l(if sandwich { OProj } else { AttnResidual })],
            PreFfnNorm => vec![l(AttnResidual)],
            Gate | Up | GateUpProj => vec![mlp_in],
            GatePart | UpPart => vec![l(GateUpProj)],
            ActFn | ActivationFn => vec![l(gate)],
            ActMul => vec![l(act), l(up)],
            Down => vec![l(ActMul)],
            Mlp if wiring.sparse(self.layer) && shared => vec![l(Experts), l(shared_down)],
            Mlp if wiring.sparse(self.layer) => vec![mlp_in, l(RouterIndices), l(RouterWeights)],
            Mlp => vec![l(ActMul)],
            Router | RouterWg | SharedGate | SharedUp | SharedMlpGate | SharedMlpUp => vec![mlp_in],
            RouterIndices => vec![l(router)],
            RouterWeights => vec![l(router), l(RouterIndices)],
            Experts => vec![mlp_in, l(RouterIndices), l(RouterWeights)],
            SharedActFn => vec![l(SharedGate)],
            SharedActMul => vec![l(SharedActFn), l(SharedUp)],
            SharedDown | SharedExperts => vec![l(SharedActMul)],
            SharedMlpActFn => vec![l(SharedMlpGate)],
            SharedMlpActMul => vec![l(SharedMlpActFn), l(SharedMlpUp)],
            SharedMlpDown | SharedMlp => vec![l(SharedMlpActMul)],
            PostFfnNorm => vec![mlp_out],
            LayerOutput => vec![l(AttnResidual), if sandwich { l(PostFfnNorm) } else { mlp_out }],
            FinalNorm => vec![Module::layer_input(n_layers)],
            LmHead => vec![Module::model(FinalNorm)],
            Logits => vec![Module::model(LmHead)],
        }
    }
}

impl fmt::Display for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for role in ModuleRole::ALL {
            let m = Module::layer(12, role);
            assert_eq!(Module::parse(&m.name()), Some(m), "{role:?}");
        }
        assert_eq!(Module::layer(3, Down).name(), "model.layers.3.mlp.down_proj");
        assert_eq!(Module::layer(3, LayerOutput).name(), "model.layers.3");
        assert_eq!(Module::layer(3, LmHead).name(), "lm_head");
        assert_eq!(Module::layer(3, SelfAttn).param("weight"), "model.layers.3.self_attn.o_proj.weight");
        assert_eq!(Module::layer(3, Mlp).names(), ["model.layers.3.mlp.down_proj", "model.layers.3.mlp"]);
        for bad in [
            "model.layers",
            "model.layers.",
            "model.layers.x",
            "model.layers.01",
            "model.layers.1.mlp.nope",
            "model.norm.weight",
            "norm",
            "model.layers.1.lm_head",
        ] {
            assert_eq!(Module::parse(bad), None, "{bad}");
        }
        assert_eq!(Module::layer_input(0), Module::model(Embedding));
        assert_eq!(Module::model(FinalNorm).inputs(30), [Module::layer(29, LayerOutput)]);
    }
}
