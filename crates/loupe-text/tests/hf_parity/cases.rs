//! Inputs shared by the Rust side and the Python reference (sent to it in the request).

use serde_json::{json, Value};

/// Text that exercises pre-tokenizer regexes, byte fallback, added tokens and whitespace rules.
pub const STRINGS: &[&str] = &[
    "Hello world",
    "Hello, world! How are you today?",
    " leading space",
    "trailing space ",
    "  two leading spaces",
    "multiple     spaces   inside",
    "line one\nline two\n\nline four",
    "\n\n\nstarts with newlines",
    "tabs\tand\ttabs\t\t",
    "In 1492 there were 12345 ships",
    "3.14159 and 2,718,281 and 1e-10 and 0x1F and 1234567890123",
    "def add(a, b):\n    return a + b\n",
    "fn main() { println!(\"{}\", x.len()); }",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text",
    "<|im_start|><|im_end|><|im_start|>",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "  \n  x \t\n\n   y",
    " <|im_start|> spaced <|im_end|> ",
    "Café naïve résumé façade",
    "日本語のテキストです。中文文本。",
    "한국어 텍스트",
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 ❤️",
    "Ελληνικά και русский текст",
    "العربية نص",
    "Mixed: abc123def 456ghi",
    "I'm sure you're right, it's what we'd've done. DON'T YOU'LL",
    "URL: https://example.com/path?q=1&r=2#frag email@example.com",
    "!!!???...--- ***",
    "",
    " ",
    "\u{a0}non-breaking\u{3000}ideographic\u{2028}sep\u{85}nel",
    "Zero\u{200b}width joiner\u{200d}x",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.",
    "<think>reasoning</think> answer",
    "</s><s><unk> sentencepiece specials",
    "\r\nwindows\r\nlines\r\n",
    "control \u{1}\u{1f}\u{7f} chars",
    "<0x0A> literal byte token text",
    "<empty output> and <jupyter_output>",
];

fn msg(role: &str, content: &str) -> Value {
    json!({"role": role, "content": content})
}

/// Conversations rendered with the model's own template.
pub fn chats() -> Vec<Vec<Value>> {
    vec![
        vec![msg("user", "What is the capital of France?")],
        vec![msg("system", "You are a pirate."), msg("user", "Hi")],
        vec![msg("user", "Hi"), msg("assistant", "Hello! How can I help?"), msg("user", "Tell me a joke.")],
        vec![
            msg("system", "Be brief."),
            msg("user", "2+2?"),
            msg("assistant", "4"),
            msg("user", "  spaces  \n and newlines\n"),
        ],
        vec![msg("user", "Emoji 😀 and 日本語 and <b>html</b> & \"quotes\"")],
    ]
}

/// A Llama 3 style template (the shape Meta ships).
pub const LLAMA3: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}\
{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}\
{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}\
{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

/// A Llama 3.1 style template with tools, a date, namespaces, tojson and whitespace control.
pub const TOOLS: &str = r#"{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none %}
    {{- "You have these tools:\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- set ns = namespace(count=0, roles=[]) %}
{%- for message in messages %}
    {%- set ns.count = ns.count + 1 %}
    {%- if message.content is string and message.content.strip().startswith('skip') %}{% continue %}{% endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{{- "[" ~ ns.count ~ " " ~ (messages | selectattr('role', 'equalto', 'user') | list | length) ~ "]" }}
{%- for k, v in {'b': 1, 'a': [1.5, none, true]}.items() %}{{ k }}={{ v | tojson }};{% endfor %}
{{- {'z': 'é<&>', 'y': {'n': 1e20}} | tojson(sort_keys=true, separators=(',', ':')) }}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"#;

/// Mistral style: roles must alternate, else `raise_exception`.
pub const ALTERNATE: &str = "{{ bos_token }}{% for message in messages %}\
{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\
{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}\
{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}\
{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}\
{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}";

/// Block tags on their own lines (trim_blocks/lstrip_blocks), {% generation %}, printing values.
pub const BLOCKS: &str = "{% for message in messages %}
    {% if message.role == 'assistant' %}
        {% generation %}
        <a>{{ message.content }}</a>
        {% endgeneration %}
    {% else %}
        <{{ message.role }}>{{ message.content }}
    {% endif %}
{% endfor %}
{{ none }} {{ true }} {{ false }} {{ 3 / 2 }} {{ 7 // 2 }} {{ unk_token }} {{ pad_token }}
{% if add_generation_prompt %}
<a>
{% endif %}
";

/// Python's whitespace (U+001C..U+001F included) in strip/split/trim.
pub const WHITESPACE: &str = "{% for m in messages %}[{{ m.content|trim }}][{{ m.content.strip() }}]\
[{{ m.content.lstrip() }}][{{ m.content.rstrip() }}]{{ m.content.split()|length }}\
[{{ m.content.strip(' \u{1c}') }}]{% endfor %}";

/// Templates rendered against transformers with the SmolLM2 tokenizer's special tokens.
pub fn templates() -> Vec<Value> {
    let conv = vec![
        msg("system", " Sys prompt "),
        msg("user", "Hi there"),
        msg("assistant", "Hello!"),
        msg("user", "skip me"),
    ];
    let alternating = vec![msg("user", "a"), msg("assistant", "b"), msg("user", "c")];
    let broken = vec![msg("user", "a"), msg("user", "b")];
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Zürich"]},
        "days": {"type": "integer", "minimum": 1.0}}, "required": ["city"]}}}]);
    let date = json!({"date_string": "26 Jul 2024"});
    let t = |name: &str, source: &str, messages: &[Value], gen: bool, tools: Value, vars: Value| {
        json!({"name": name, "source": source, "messages": messages, "add_generation_prompt": gen,
               "tools": tools, "vars": vars})
    };
    vec![
        t("llama3", LLAMA3, &conv, false, Value::Null, json!({})),
        t("llama3_gen", LLAMA3, &conv, true, Value::Null, json!({})),
        t("tools", TOOLS, &conv, true, tools.clone(), date.clone()),
        t("tools_none", TOOLS, &conv[1..], false, Value::Null, date),
        t("alternate_ok", ALTERNATE, &alternating, false, Value::Null, json!({})),
        t("alternate_raise", ALTERNATE, &broken, false, Value::Null, json!({})),
        t("alternate_role", ALTERNATE, &[msg("system", "x")], false, Value::Null, json!({})),
        t("blocks", BLOCKS, &conv, true, Value::Null, json!({})),
        t("blocks_nogen", BLOCKS, &alternating, false, Value::Null, json!({})),
        t("python_whitespace", WHITESPACE, &[msg("user", "\u{1c} a\u{a0}b \u{1f}\n")], false, Value::Null, json!({})),
    ]
}
