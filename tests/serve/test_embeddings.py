"""`/v1/embeddings` on all-MiniLM-L6-v2 through the `openai` client, as users call it: the
client's default base64 transport and plain floats give the same vectors, which equal
`loupe embed`'s and the transformers reference's (`python -m loupe_reference embed`, the
checkpoint's sentence-transformers pipeline by hand); a paraphrase is nearer than an unrelated
text; bad requests are 400s naming their parameter; a decoder refuses the route and an
encoder refuses generation.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import openai
import pytest

from conftest import REPO, Server, loupe_bin, minilm_model_path

MODEL = "all-MiniLM-L6-v2"
TEXTS = ["The cat sits on the mat.", "A feline rests on a rug.", "Quarterly revenue rose by five percent."]


@pytest.fixture(scope="module")
def minilm():
    s = Server(model=minilm_model_path())
    yield s
    assert s.stop() == 0, "".join(s.log)


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_vectors_match_loupe_embed_and_the_reference(minilm):
    client = minilm.client()
    r = client.embeddings.create(model=MODEL, input=TEXTS)  # the client asks for base64
    floats = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    assert [d.index for d in r.data] == [0, 1, 2]
    assert r.usage.prompt_tokens == r.usage.total_tokens == floats.usage.prompt_tokens
    ours = [d.embedding for d in r.data]
    assert all(len(v) == 384 for v in ours)
    # base64 carries the f32 bytes exactly; JSON floats print them to round-trip.
    assert ours == [d.embedding for d in floats.data]
    for v in ours:
        assert abs(math.sqrt(sum(x * x for x in v)) - 1.0) < 1e-5
    cli = subprocess.run([str(loupe_bin()), "embed", "--model", str(minilm_model_path()), *TEXTS], capture_output=True, text=True, check=True)
    assert [d["embedding"] for d in json.loads(cli.stdout)["data"]] == ours
    ref = subprocess.run([sys.executable, "-m", "loupe_reference", "embed", "--hf-dir", str(minilm_model_path()), *TEXTS],
                         capture_output=True, text=True, cwd=REPO / "reference")
    assert ref.returncode == 0, ref.stderr
    for a, b in zip(ours, json.loads(ref.stdout)["embeddings"]):
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5
    assert cosine(ours[0], ours[1]) > cosine(ours[0], ours[2]) + 0.3


def test_one_string_and_dimensions(minilm):
    client = minilm.client()
    r = client.embeddings.create(model=MODEL, input="just one", dimensions=384)
    assert len(r.data) == 1 and len(r.data[0].embedding) == 384
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=MODEL, input="x", dimensions=128)
    assert e.value.body["param"] == "dimensions"


@pytest.mark.parametrize("body,param", [
    ({"input": []}, "input"),
    ({"input": [[101, 102]]}, "input"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "temperature": 0}, "temperature"),
])
def test_bad_requests_name_their_parameter(minilm, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        minilm.client().post("/embeddings", body=body, cast_to=object)
    assert e.value.body["param"] == param


def test_an_unknown_model_is_404(minilm):
    with pytest.raises(openai.NotFoundError):
        minilm.client().embeddings.create(model="other", input="x")


def test_an_encoder_refuses_generation(minilm):
    with pytest.raises(openai.BadRequestError) as e:
        minilm.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert "encoder" in e.value.body["message"]


def test_a_decoder_refuses_embeddings():
    s = Server()
    try:
        client = s.client()
        with pytest.raises(openai.BadRequestError) as e:
            client.embeddings.create(model=client.models.list().data[0].id, input="hello")
        assert e.value.body["param"] == "model" and "decoder" in e.value.body["message"]
    finally:
        assert s.stop() == 0, "".join(s.log)
