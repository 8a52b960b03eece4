//! Splitting generated text into answer, reasoning and tool-call sections, as it streams.
//!
//! Reasoning models write their thinking between markers (`<think>` … `</think>` for Qwen3
//! and DeepSeek-R1) and tool calls between others (`<tool_call>` … `</tool_call>` for
//! Qwen2.5/Qwen3 and Hermes). A server returns the thinking in the message's `reasoning`
//! field (vLLM's current name; not the older `reasoning_content`) and tool calls in
//! `tool_calls`, so the text must be split, also while it streams, where a marker can
//! arrive split across chunks (`<thi` + `nk>`). [`SectionSplitter`] holds back any tail
//! that could still begin a marker, and never emits a marker itself.
//!
//! Sections may interleave in one turn: think, call a tool, think again, answer. A tool
//! call's body is emitted whole when its end marker arrives (its JSON is parsed then); an
//! unterminated one is returned as answer text at the end, markers included, so nothing
//! the model wrote is lost.

/// One piece of generated text, by the section it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Section {
    /// Answer text (the message's `content`).
    Content(String),
    /// Thinking (the message's `reasoning`).
    Reasoning(String),
    /// The whole body of one tool call (between its markers), not yet parsed.
    ToolCall(String),
}

/// Which markers a model family uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SectionMarkers {
    /// `(open, close)` of a reasoning block; `None`: the model does not reason in text.
    pub reasoning: Option<(&'static str, &'static str)>,
    /// Output starts inside a reasoning block: the chat template already wrote its
    /// opening marker into the prompt (DeepSeek-R1's template does).
    pub starts_in_reasoning: bool,
    /// `(open, close)` of a tool call; `None`: tool calls are not split out.
    pub tool_call: Option<(&'static str, &'static str)>,
}

/// Hermes / Qwen2.5 / Qwen3 tool-call markers.
pub const TOOL_CALL_MARKERS: (&str, &str) = ("<tool_call>", "</tool_call>");

/// The reasoning parsers, by the name `--reasoning-parser` takes.
pub const REASONING_PARSERS: &[&str] = &["qwen3", "deepseek_r1", "none"];

impl SectionMarkers {
    /// No sections: all text is answer text.
    pub const PLAIN: SectionMarkers = SectionMarkers { reasoning: None, starts_in_reasoning: false, tool_call: None };

    /// These markers, with tool calls split out too.
    pub fn with_tool_calls(self) -> SectionMarkers {
        SectionMarkers { tool_call: Some(TOOL_CALL_MARKERS), ..self }
    }

    /// The markers of reasoning parser `name` (one of [`REASONING_PARSERS`]), with the
    /// Hermes/Qwen tool-call markers; `None` for an unknown name.
    pub fn for_reasoning_parser(name: &str) -> Option<SectionMarkers> {
        const THINK: (&str, &str) = ("<think>", "</think>");
        const TOOL: (&str, &str) = TOOL_CALL_MARKERS;
        match name {
            "qwen3" => {
                Some(SectionMarkers { reasoning: Some(THINK), starts_in_reasoning: false, tool_call: Some(TOOL) })
            }
            "deepseek_r1" => {
                Some(SectionMarkers { reasoning: Some(THINK), starts_in_reasoning: true, tool_call: Some(TOOL) })
            }
            "none" => Some(SectionMarkers { tool_call: Some(TOOL), ..SectionMarkers::PLAIN }),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Content,
    Reasoning,
    ToolCall,
}

/// Streams text into [`Section`]s; see the module docs.
#[derive(Debug, Clone)]
pub struct SectionSplitter {
    markers: SectionMarkers,
    state: State,
    /// Text received but not yet emitted: a possible marker prefix, or a tool call's body.
    pending: String,
}

impl SectionSplitter {
    pub fn new(markers: SectionMarkers) -> SectionSplitter {
        let state =
            if markers.starts_in_reasoning && markers.reasoning.is_some() { State::Reasoning } else { State::Content };
        SectionSplitter { markers, state, pending: String::new() }
    }

    /// Markers that end the current state, with the state each leads to.
    fn exits(&self) -> Vec<(&'static str, State)> {
        let m = &self.markers;
        match self.state {
            State::Content => m
                .reasoning
                .map(|r| (r.0, State::Reasoning))
                .into_iter()
                .chain(m.tool_call.map(|t| (t.0, State::ToolCall)))
                .collect(),
            State::Reasoning => m.reasoning.map(|r| (r.1, State::Content)).into_iter().collect(),
            State::ToolCall => m.tool_call.map(|t| (t.1, State::Content)).into_iter().collect(),
        }
    }

    fn section(state: State, text: String) -> Section {
        match state {
            State::Content => Section::Content(text),
            State::Reasoning => Section::Reasoning(text),
            State::ToolCall => Section::ToolCall(text),
        }
    }

    /// Adds `chunk`; returns the sections now complete enough to emit (adjacent pieces of
    /// one kind merged; empty pieces dropped, except a tool call, which may be empty).
    pub fn push(&mut self, chunk: &str) -> Vec<Section> {
        self.pending.push_str(chunk);
        let mut out: Vec<Section> = Vec::new();
        let emit = |s: Section, out: &mut Vec<Section>| match (out.last_mut(), &s) {
            (_, Section::Content(t) | Section::Reasoning(t)) if t.is_empty() => {}
            (Some(Section::Content(a)), Section::Content(b)) | (Some(Section::Reasoning(a)), Section::Reasoning(b)) => {
                a.push_str(b)
            }
            _ => out.push(s),
        };
        loop {
            let exits = self.exits();
            let found = exits
                .iter()
                .filter_map(|&(marker, next)| self.pending.find(marker).map(|at| (at, marker, next)))
                .min_by_key(|x| x.0);
            match found {
                Some((at, marker, next)) => {
                    let before: String = self.pending[..at].to_string();
                    self.pending.drain(..at + marker.len());
                    emit(Self::section(self.state, before), &mut out);
                    self.state = next;
                }
                None => {
                    if self.state == State::ToolCall {
                        // A tool call is emitted whole, at its end marker.
                        break;
                    }
                    let hold = exits.iter().map(|&(marker, _)| held_prefix(&self.pending, marker)).max().unwrap_or(0);
                    let ready: String = self.pending[..self.pending.len() - hold].to_string();
                    self.pending.drain(..self.pending.len() - hold);
                    emit(Self::section(self.state, ready), &mut out);
                    break;
                }
            }
        }
        out
    }

    /// Ends the text: whatever is held back. An unterminated tool call comes back as
    /// answer text with its opening marker, since it cannot be parsed as a call.
    pub fn finish(mut self) -> Vec<Section> {
        let rest = std::mem::take(&mut self.pending);
        let section = match self.state {
            State::ToolCall => Section::Content(format!("{}{rest}", self.markers.tool_call.map_or("", |t| t.0))),
            state => Self::section(state, rest),
        };
        match &section {
            Section::Content(t) | Section::Reasoning(t) if t.is_empty() => Vec::new(),
            _ => vec![section],
        }
    }

    /// Splits a whole text at once.
    pub fn split_all(markers: SectionMarkers, text: &str) -> Vec<Section> {
        let mut s = SectionSplitter::new(markers);
        let mut out = s.push(text);
        out.extend(s.finish());
        merge(out)
    }
}

/// Adjacent sections of one kind (answer or reasoning) joined.
pub fn merge(sections: Vec<Section>) -> Vec<Section> {
    let mut out: Vec<Section> = Vec::new();
    for s in sections {
        match (out.last_mut(), s) {
            (Some(Section::Content(a)), Section::Content(b)) | (Some(Section::Reasoning(a)), Section::Reasoning(b)) => {
                a.push_str(&b)
            }
            (_, s) => out.push(s),
        }
    }
    out
}

/// The length of the longest tail of `text` that is a proper prefix of `marker` (it could
/// still become the marker), on a character boundary.
fn held_prefix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&k| marker.is_char_boundary(k) && text.ends_with(&marker[..k]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen3() -> SectionMarkers {
        SectionMarkers::for_reasoning_parser("qwen3").unwrap()
    }

    const TURN: &str = "<think>The user wants weather. I'll call the tool.</think>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<think>Now Rome too.</think><tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}</tool_call>Both are sunny.";

    fn expected() -> Vec<Section> {
        vec![
            Section::Reasoning("The user wants weather. I'll call the tool.".into()),
            Section::Content("\n".into()),
            Section::ToolCall("\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n".into()),
            Section::Content("\n".into()),
            Section::Reasoning("Now Rome too.".into()),
            Section::ToolCall("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}".into()),
            Section::Content("Both are sunny.".into()),
        ]
    }

    #[test]
    fn interleaved_thinking_and_tool_calls_split_in_one_turn() {
        assert_eq!(SectionSplitter::split_all(qwen3(), TURN), expected());
    }

    #[test]
    fn every_chunking_gives_the_same_sections_and_never_leaks_a_marker() {
        // Chunks of every size from 1 to 12 characters, so each marker is split everywhere.
        for size in 1..=12 {
            let chars: Vec<char> = TURN.chars().collect();
            let mut s = SectionSplitter::new(qwen3());
            let mut got = Vec::new();
            for piece in chars.chunks(size) {
                let piece: String = piece.iter().collect();
                for section in s.push(&piece) {
                    if let Section::Content(t) | Section::Reasoning(t) = &section {
                        assert!(!t.contains('<') || !t.contains("think>"), "size {size}: leaked {t:?}");
                    }
                    got.push(section);
                }
            }
            got.extend(s.finish());
            assert_eq!(merge(got), expected(), "chunk size {size}");
        }
    }

    #[test]
    fn held_back_text_that_is_not_a_marker_is_released() {
        let mut s = SectionSplitter::new(qwen3());
        assert_eq!(s.push("a <thi"), vec![Section::Content("a ".into())]);
        assert_eq!(s.push("s is <b>"), vec![Section::Content("<this is <b>".into())]);
        assert_eq!(s.push("x <"), vec![Section::Content("x ".into())]);
        assert_eq!(s.finish(), vec![Section::Content("<".into())]);
    }

    #[test]
    fn deepseek_starts_inside_reasoning_and_unterminated_calls_stay_text() {
        let r1 = SectionMarkers::for_reasoning_parser("deepseek_r1").unwrap();
        assert_eq!(
            SectionSplitter::split_all(r1, "hmm</think>Answer"),
            vec![Section::Reasoning("hmm".into()), Section::Content("Answer".into())]
        );
        assert_eq!(
            SectionSplitter::split_all(qwen3(), "x<tool_call>{\"na"),
            vec![Section::Content("x<tool_call>{\"na".into())]
        );
        // "none" splits tool calls only; thinking stays in the answer.
        let none = SectionMarkers::for_reasoning_parser("none").unwrap();
        assert_eq!(
            SectionSplitter::split_all(none, "<think>a</think>b"),
            vec![Section::Content("<think>a</think>b".into())]
        );
        assert_eq!(
            SectionSplitter::split_all(SectionMarkers::PLAIN, "<tool_call>x</tool_call>"),
            vec![Section::Content("<tool_call>x</tool_call>".into())]
        );
        assert!(SectionMarkers::for_reasoning_parser("nope").is_none());
    }

    #[test]
    fn multibyte_text_near_markers_is_cut_on_character_boundaries() {
        let got = SectionSplitter::split_all(qwen3(), "é<think>日本</think>ü<");
        assert_eq!(
            got,
            vec![Section::Content("é".into()), Section::Reasoning("日本".into()), Section::Content("ü<".into())]
        );
    }
}
