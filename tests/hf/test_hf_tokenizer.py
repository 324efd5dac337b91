#!/usr/bin/env python3
"""An HF export's tokenizer as transformers loads it gives llamatrain's token ids (issue 35, point 7).

Two real tokenizers, each reaching the export the way a user's does:
  tok512       stories260K.bin converted to HF with --tokenizer tok512.model (llama2.c's pair);
  llama2       a tiny model trained one step on data prepared with the Llama 2 tokenizer, whose
               model.h5 carries it, converted to HF without --tokenizer.
For each, AutoTokenizer.from_pretrained(export) (and with use_fast=False, where that is another class)
must encode 20 prompts to the ids llamatrain's own
Tokenizer gives them (lt_tokenize_ids: BOS first, no EOS, as generate and prepare encode), and
decode them back to the prompt.

Inputs where transformers' LlamaTokenizer and SentencePiece disagree whatever the export says
(a leading space, runs of spaces, '<s>' or '</s>' written in the text, a leading U+2581) are
printed for the record, not asserted: Meta's own Llama-2-7b-hf export shows the same differences
(docs/formats.md, "Hugging Face").

Usage: test_hf_tokenizer.py LLAMATRAIN LT_TOKENIZE_IDS SHARED_DATA_DIR
Exit status: 0 pass, 1 fail, 77 skipped (no transformers, sentencepiece or protobuf, or no
../shared/data), with the reason printed.
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

SKIP = 77

PROMPTS = [
    "Once upon a time",
    "Once upon a time, there was a little girl named Lily. She loved to play outside.",
    "Tom and his dog went to the park. They saw a big red ball!",
    "Does aspirin reduce the risk of a second heart attack?",
    "Question: Is vitamin D deficiency associated with depression?\nContext: 1,282 adults were followed for 6 years.",
    "Final decision: yes",
    "The results were statistically significant (p < 0.05, n = 312).",
    "Patients aged 65-80 years received 2.5 mg/kg twice daily.",
    'She said: "I don\'t know why it\'s so hard."',
    "Café, naïve, résumé and jalapeño.",
    "日本語のテキストも扱えます。",
    "Emoji are bytes too: 🙂🚀",
    "Line one\nLine two\n\nA new paragraph.",
    "def f(x):\n\treturn x * 2 # doubled",
    "[INST] What is the capital of France? [/INST]",
    "<<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\nHello!",
    "1234567890 + 987654321 = 1111111101",
    "The quick brown fox jumps over the lazy dog.",
    "Ünïcödé ÀÉÎÕÜ ß ø å æ",
    "Why?",
]
assert len(PROMPTS) == 20

KNOWN_DIFFERENCES = [" leading space", "two  spaces", "trailing ", "Hello</s>world", "<s> tag", "\u2581prefix"]


def skip(reason):
    print("SKIP: " + reason)
    sys.exit(SKIP)


def importable(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package ("google") is missing
        return False


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s%s" % (" ".join(cmd), r.returncode, r.stdout, r.stderr))
    return r.stdout


def llamatrain_ids(tokenize_ids, source, texts, work):
    path = os.path.join(work, "texts.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(texts, f)
    return json.loads(run([tokenize_ids, source, path]))


def export_tok512(llamatrain, shared, work):
    hf = os.path.join(work, "tok512-hf")
    tok = os.path.join(shared, "tok512.model")
    run([llamatrain, "convert", "--input", os.path.join(shared, "stories260K.bin"), "--tokenizer", tok,
         "--output", hf])
    return tok, hf


def export_llama2(llamatrain, shared, work):
    text = os.path.join(work, "tales.txt")
    with open(os.path.join(shared, "tinystories_sample.txt"), encoding="utf-8") as f:
        sample = f.read(20000)
    with open(text, "w", encoding="utf-8") as f:
        f.write(sample)
    data, out, hf = (os.path.join(work, n) for n in ("llama2.h5", "llama2-out", "llama2-hf"))
    run([llamatrain, "prepare", "--text", text, "--tokenizer", os.path.join(shared, "llama2-tokenizer.model"),
         "--seq-len", "64", "--test-split", "0", "--output", data])
    run([llamatrain, "train", "--model-config", "tiny", "--vocab-size", "32000", "--data", data, "--batch-size", "2",
         "--max-steps", "1", "--seed", "1", "--no-progress", "--output", out])
    model = os.path.join(out, "model.h5")
    run([llamatrain, "convert", "--input", model, "--output", hf])
    return model, hf


def compare(name, source, hf, tokenize_ids, work):
    from transformers import AutoTokenizer

    # The default (fast, from tokenizers) and, in transformers 4, the slow one over SentencePiece.
    failures, seen = 0, set()
    for kwargs in ({}, {"use_fast": False}):
        tok = AutoTokenizer.from_pretrained(hf, **kwargs)
        if type(tok).__name__ not in seen:
            seen.add(type(tok).__name__)
            failures += compare_one(name, tok, source, hf, tokenize_ids, work)
    return failures


def compare_one(name, tok, source, hf, tokenize_ids, work):
    want = llamatrain_ids(tokenize_ids, source, PROMPTS, work)
    failures = 0
    for prompt, ids in zip(PROMPTS, want):
        got = tok(prompt)["input_ids"]
        text = tok.decode(got, skip_special_tokens=True)
        if got != ids or text != prompt:
            failures += 1
            print("FAIL %s: %r\n  llamatrain   %s\n  transformers %s\n  decoded %r" % (name, prompt, ids, got, text))
    print("%s (%s, %s): %d of %d prompts give llamatrain's ids" %
          (name, type(tok).__name__, hf, len(PROMPTS) - failures, len(PROMPTS)))
    known = llamatrain_ids(tokenize_ids, source, KNOWN_DIFFERENCES, work)
    for text, ids in zip(KNOWN_DIFFERENCES, known):
        got = tok(text)["input_ids"]
        print("  known difference %r: %s" % (text, "the same ids" if got == ids else "llamatrain %s, transformers %s" %
                                             (ids, got)))
    return failures


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    llamatrain, tokenize_ids, shared = sys.argv[1:]
    missing = [m for m in ("transformers", "sentencepiece", "google.protobuf") if not importable(m)]
    if missing:
        skip("%s cannot import %s (pip install transformers sentencepiece protobuf)" %
             (sys.executable, ", ".join(missing)))
    needed = ["stories260K.bin", "tok512.model", "llama2-tokenizer.model", "tinystories_sample.txt"]
    absent = [n for n in needed if not os.path.exists(os.path.join(shared, n))]
    if absent:
        skip("%s lacks %s (../shared/data, beside the checkout)" % (shared, ", ".join(absent)))
    import transformers

    print("transformers %s" % transformers.__version__)
    failures = 0
    with tempfile.TemporaryDirectory() as work:
        for name, export in (("tok512", export_tok512), ("llama2", export_llama2)):
            source, hf = export(llamatrain, shared, work)
            for f in ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
                if not os.path.exists(os.path.join(hf, f)):
                    print("FAIL %s: the export %s has no %s" % (name, hf, f))
                    failures += 1
            failures += compare(name, source, hf, tokenize_ids, work)
    print("FAIL" if failures else "PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
