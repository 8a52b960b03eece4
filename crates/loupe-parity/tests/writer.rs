//! The one writer of the dump layout against the one reader: atomic staging, execution
//! order, axes, aliases and repeated calls, the three file styles.

use std::path::Path;

use loupe_parity::{Capture, DumpStyle, DumpWriter, Manifest, TensorSource};

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

fn data(n: usize, k: f32) -> Vec<f32> {
    (0..n).map(|i| i as f32 * k - 1.0).collect()
}

#[test]
fn nothing_is_visible_until_finish() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dump");
    let mut w = DumpWriter::create(&out, "test", DumpStyle::Npy).unwrap();
    w.add("model.embed_tokens", 0, &[2, 3], &data(6, 1.0)).unwrap();
    // The tensor went into a hidden staging directory beside the target, which has no
    // manifest yet; the target does not exist, so no reader can take it for a dump.
    assert!(!out.exists());
    assert!(w.staging().join("step0/model.embed_tokens.npy").is_file());
    assert!(!w.staging().join("manifest.json").exists());
    assert!(w.staging().file_name().unwrap().to_string_lossy().starts_with(".dump.partial-"));
    assert!(TensorSource::open(&out).is_err());
    let done = w.finish().unwrap();
    assert_eq!(done, out);
    assert_eq!(listing(tmp.path()), ["dump"], "staging left behind");
    assert_eq!(listing(&out), ["manifest.json", "step0"]);
    TensorSource::open(&out).unwrap();
}

#[test]
fn a_dropped_or_failed_writer_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dump");
    {
        let mut w = DumpWriter::create(&out, "test", DumpStyle::Binary).unwrap();
        w.add("a", 0, &[2], &[1.0, 2.0]).unwrap();
        // a shape that does not match the data fails without touching anything else
        assert!(w.add("b", 0, &[3], &[1.0, 2.0]).is_err());
    }
    assert!(listing(tmp.path()).is_empty(), "{:?}", listing(tmp.path()));
    let mut w = DumpWriter::create(&out, "test", DumpStyle::Npy).unwrap();
    w.add("a", 0, &[1], &[1.0]).unwrap();
    w.abort();
    assert!(listing(tmp.path()).is_empty());
}

#[test]
fn an_earlier_dump_stays_whole_until_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dump");
    let mut w = DumpWriter::create(&out, "test", DumpStyle::Npy).unwrap();
    w.add("a", 0, &[2], &[1.0, 2.0]).unwrap();
    w.finish().unwrap();

    let mut w = DumpWriter::create(&out, "test", DumpStyle::Npy).unwrap();
    w.add("b", 0, &[2], &[3.0, 4.0]).unwrap();
    let old = TensorSource::open(&out).unwrap();
    assert_eq!(old.entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["a"]);
    w.finish().unwrap();
    let new = TensorSource::open(&out).unwrap();
    assert_eq!(new.entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["b"]);
    assert_eq!(listing(&out.join("step0")), ["b.npy"]);
    assert_eq!(listing(tmp.path()), ["dump"]);

    // A directory that is not a dump is never replaced.
    let other = tmp.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), "mine").unwrap();
    let e = DumpWriter::create(&other, "test", DumpStyle::Npy).unwrap_err().to_string();
    assert!(e.contains("not a loupe dump") && e.contains("other"), "{e}");
    // An empty one is fine.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let mut w = DumpWriter::create(&empty, "test", DumpStyle::Npy).unwrap();
    w.add("x", 0, &[1], &[0.0]).unwrap();
    w.finish().unwrap();
    assert_eq!(listing(&empty), ["manifest.json", "step0"]);
}

#[test]
fn order_axes_aliases_and_repeats_round_trip() {
    for style in [DumpStyle::Npy, DumpStyle::Binary, DumpStyle::Max] {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("dump");
        let mut w = DumpWriter::create(&out, "loupe", style).unwrap();
        w.manifest.prompt_tokens = Some(vec![1, 2]);
        w.manifest.generated_tokens = Some(vec![7]);
        w.manifest.layers = Some(1);
        let aliases = vec!["model.layers.0.self_attn".to_string()];
        let o = data(8, 0.5);
        let probs = data(2 * 2 * 2, 0.25);
        let written = w
            .capture(&Capture {
                name: "model.layers.0.self_attn.o_proj",
                aliases: &aliases,
                step: 0,
                shape: &[2, 4],
                axes: &["token", "feature"],
                data: &o,
            })
            .unwrap();
        assert_eq!(written, ["model.layers.0.self_attn.o_proj", "model.layers.0.self_attn"]);
        w.capture(&Capture {
            name: "model.layers.0.self_attn.attn_probs",
            aliases: &[],
            step: 0,
            shape: &[2, 2, 2],
            axes: &["head", "query", "key"],
            data: &probs,
        })
        .unwrap();
        // The same module called twice in one step: the second call is `name(1)`.
        assert_eq!(w.add("model.norm", 0, &[2, 4], &data(8, 1.0)).unwrap(), "model.norm");
        assert_eq!(w.add("model.norm", 0, &[2, 4], &data(8, 2.0)).unwrap(), "model.norm(1)");
        // A new step starts the count again; the order goes on.
        assert_eq!(w.add("model.norm", 1, &[1, 4], &data(4, 3.0)).unwrap(), "model.norm");
        w.finish().unwrap();

        let m = Manifest::read(&out).unwrap();
        assert_eq!(
            (m.prompt_tokens.as_deref(), m.generated_tokens.as_deref(), m.layers),
            (Some(&[1, 2][..]), Some(&[7][..]), Some(1))
        );
        assert!(m.faults.is_none());
        let names: Vec<(&str, u32, Option<u64>)> =
            m.tensors.iter().map(|t| (t.name.as_str(), t.step, t.order)).collect();
        assert_eq!(
            names,
            [
                ("model.layers.0.self_attn.o_proj", 0, Some(0)),
                ("model.layers.0.self_attn", 0, Some(1)),
                ("model.layers.0.self_attn.attn_probs", 0, Some(2)),
                ("model.norm", 0, Some(3)),
                ("model.norm(1)", 0, Some(4)),
                ("model.norm", 1, Some(5)),
            ],
            "{style:?}"
        );
        assert_eq!(m.tensors[2].axes.as_deref(), Some(&["head".to_string(), "query".into(), "key".into()][..]));
        assert_eq!(m.tensors[0].file, format!("step0/model.layers.0.self_attn.o_proj{}", style.ext()));
        assert_eq!(m.tensors[4].file, format!("step0/model.norm(1){}", style.ext()));
        let s = m.tensors[0].stats.as_ref().unwrap();
        assert_eq!((s.min, s.max), (Some(-1.0), Some(2.5)));

        let src = TensorSource::open(&out).unwrap();
        assert!(src.ordered);
        assert_eq!(src.prompt_tokens(), Some(&[1, 2][..]));
        let a = src.load_named("model.layers.0.self_attn", 0).unwrap().unwrap();
        let b = src.load_named("model.layers.0.self_attn.o_proj", 0).unwrap().unwrap();
        assert_eq!((&a.shape, &a.data), (&vec![2, 4], &o));
        assert_eq!(a, b, "an alias holds the same value");
        let p = src.load_named("model.layers.0.self_attn.attn_probs", 0).unwrap().unwrap();
        assert_eq!((p.shape, p.data), (vec![2, 2, 2], probs.clone()));
        assert_eq!(src.load_named("model.norm(1)", 0).unwrap().unwrap().data, data(8, 2.0));
        assert_eq!(src.load_named("model.norm", 1).unwrap().unwrap().shape, [1, 4]);
        assert!(src.load_named("model.norm", 2).unwrap().is_none());
    }
}

#[test]
fn two_names_for_one_file_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = DumpWriter::create(tmp.path().join("d"), "test", DumpStyle::Npy).unwrap();
    w.add("a b", 0, &[1], &[0.0]).unwrap();
    let e = w.add("a_b", 0, &[1], &[0.0]).unwrap_err().to_string();
    assert!(e.contains("same file step0/a_b.npy"), "{e}");
}

#[test]
fn manifest_keys_match_the_reference_writer() {
    // dumpfmt.py writes format, version, the header, then `tensors` last; each tensor's
    // keys in this order.
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("d");
    let mut w = DumpWriter::create(&out, "loupe", DumpStyle::Npy).unwrap();
    w.add("x", 0, &[1, 2], &[f32::NAN, 1.0]).unwrap();
    w.finish().unwrap();
    let text = std::fs::read_to_string(out.join("manifest.json")).unwrap();
    let keys = |s: &str| -> Vec<usize> {
        ["\"format\"", "\"version\"", "\"producer\"", "\"prompt_tokens\"", "\"tensors\""]
            .iter()
            .map(|k| s.find(k).unwrap_or_else(|| panic!("{k} in {s}")))
            .collect()
    };
    let k = keys(&text);
    assert!(k.windows(2).all(|p| p[0] < p[1]), "{text}");
    let t = &text[text.find("\"tensors\"").unwrap()..];
    let k: Vec<usize> =
        ["\"name\"", "\"step\"", "\"order\"", "\"file\"", "\"dtype\"", "\"shape\"", "\"axes\"", "\"stats\""]
            .iter()
            .map(|key| t.find(key).unwrap())
            .collect();
    assert!(k.windows(2).all(|p| p[0] < p[1]), "{t}");
    // NaN is counted, never written as a number.
    assert!(t.contains("\"nan\": 1") && !t.contains("NaN"), "{t}");
    assert!(text.ends_with("}\n"));
}
