"""Write the bundled demo corpus: seven small datasets in different formats, plus manifest.yaml.

  arithmetic     messages JSONL     multi-step word problems; every step computed by code
  instructions   sharegpt JSONL.gz  format constraints (uppercase, bullets, JSON, sorting...) met by
                                    code; holds one malformed line and one empty turn on purpose,
                                    so the rejects path shows (well under the 5% threshold)
  chat           messages Parquet   multi-turn chat (unit conversions, recipe scaling, capitals)
  tools          messages JSONL     JSON-schema `tools`, assistant `tool_calls`, `tool` results
  long_reports   messages JSONL     few samples with many tokens (long inventory tables): it plays
                                    the seed's A1 (~7% of the samples, ~30% of the tokens)
  coding         messages JSONL     "write a function that ..." requests
  code_completion messages JSONL    typed function stubs with docstring and doctests to complete
                                    (the shape of HumanEval prompts; tasks of our own, see
                                    eagle3/demo/code_tasks.py)

Everything is deterministic from --seed. --scale multiplies the sample counts; scale 1 is about
2,550 conversations and 0.7M SmolLM2 tokens, small enough to extract and train on 2 CPU cores.
Answers are computed by code (a later stage may regenerate them with the target). No HumanEval
content: it is the held-out benchmark.

Example:
  eagle3 demo-data --out demo-data --scale 1 --seed 42
  eagle3 tokenize --manifest demo-data/manifest.yaml --tokenizer smollm2-135m-instruct --out PREP
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import random

from eagle3 import storage
from eagle3.demo.code_tasks import code_completion
from eagle3.config import DEFAULT_SEED
from eagle3.errors import InputError

# name -> (samples at scale 1, format, file, category)
DATASETS = {
    "arithmetic": (250, "messages", "data/arithmetic.jsonl", "math"),
    "instructions": (250, "sharegpt", "data/instructions.jsonl.gz", "instruction_following"),
    "chat": (300, "messages", "data/chat.parquet", "chat"),
    "tools": (150, "messages", "data/tools.jsonl", "tool_use"),
    "long_reports": (200, "messages", "data/long_reports.jsonl", "long_context"),
    "coding": (200, "messages", "data/coding.jsonl", "code"),
    "code_completion": (1200, "messages", "data/code_completion.jsonl", "code"),
}
# Small Python tasks, written for this corpus (not from HumanEval, the held-out benchmark):
# (function name, argument, what it returns, reference body)
CODE_TASKS = [
    ("sum_of_squares", "n", "the sum of the squares of the integers from 1 to n",
     "return sum(i * i for i in range(1, n + 1))"),
    ("count_vowels", "text", "how many vowels (a, e, i, o, u, either case) the string contains",
     "return sum(1 for ch in text.lower() if ch in 'aeiou')"),
    ("mirror_words", "sentence", "the sentence with the letters of every word reversed",
     "return ' '.join(w[::-1] for w in sentence.split())"),
    ("running_total", "numbers", "a list where item i is the sum of numbers[0..i]",
     "out, total = [], 0\n    for x in numbers:\n        total += x\n        out.append(total)\n    return out"),
    ("word_lengths", "sentence", "a list with the length of each word of the sentence",
     "return [len(w) for w in sentence.split()]"),
    ("max_gap", "numbers", "the largest difference between two neighbouring items of the list",
     "return max(abs(a - b) for a, b in zip(numbers, numbers[1:]))"),
    ("digits_sum", "n", "the sum of the decimal digits of the non-negative integer n",
     "return sum(int(d) for d in str(n))"),
    ("evens_only", "numbers", "the even items of the list, in order",
     "return [x for x in numbers if x % 2 == 0]"),
    ("capitalize_words", "sentence", "the sentence with the first letter of every word in upper case",
     "return ' '.join(w[:1].upper() + w[1:] for w in sentence.split())"),
    ("count_char", "text, ch", "how many times the character ch occurs in text",
     "return sum(1 for c in text if c == ch)"),
    ("fizzbuzz_line", "n", "'Fizz' for multiples of 3, 'Buzz' for 5, 'FizzBuzz' for both, else str(n)",
     "if n % 15 == 0:\n        return 'FizzBuzz'\n    if n % 3 == 0:\n        return 'Fizz'\n    if n % 5 == 0:\n"
     "        return 'Buzz'\n    return str(n)"),
    ("second_largest", "numbers", "the second largest distinct value in the list",
     "return sorted(set(numbers))[-2]"),
]
ITEMS = ["apples", "pencils", "books", "tickets", "boxes", "bottles", "marbles", "stamps", "cookies", "tiles"]
NAMES = ["Ana", "Ben", "Chloe", "Dev", "Elif", "Femi", "Goro", "Hana", "Ivan", "Jun", "Kira", "Leo", "Mona", "Nils"]
CITIES = ["Lisbon", "Osaka", "Nairobi", "Lima", "Oslo", "Hanoi", "Quito", "Perth", "Riga", "Tunis", "Accra", "Cork"]
CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi", "Peru": "Lima", "Norway": "Oslo",
            "Vietnam": "Hanoi", "Ecuador": "Quito", "Latvia": "Riga", "Tunisia": "Tunis", "Ghana": "Accra",
            "Canada": "Ottawa", "Chile": "Santiago", "Egypt": "Cairo", "Poland": "Warsaw", "Mongolia": "Ulaanbaatar"}
WORDS = ("the quick river carried small boats past quiet green hills while children counted clouds and "
         "old friends shared warm bread near the market square before evening rain").split()
SYSTEMS = ["You are a helpful assistant.", "You are a careful tutor. Show your work step by step.",
           "Answer precisely and follow the requested format."]


def _step(op: str, a: int, b: int) -> tuple[int, str]:
    c = {"+": a + b, "-": a - b, "×": a * b, "÷": a // b}[op]
    return c, f"{a} {op} {b} = {c}"


def _arithmetic(rng: random.Random) -> dict:
    item, name = rng.choice(ITEMS), rng.choice(NAMES)
    start, packs, per, sold, people = (rng.randint(10, 300), rng.randint(2, 9), rng.randint(3, 24),
                                       rng.randint(1, 60), rng.choice([2, 3, 4, 5, 6]))
    got, s1 = _step("×", packs, per)
    total, s2 = _step("+", start, got)
    sold = min(sold, total - 1)
    left, s3 = _step("-", total, sold)
    share_total = left - left % people
    share, s4 = _step("÷", share_total, people)
    q = (f"{name} has {start} {item}. {name} buys {packs} packs with {per} {item} in each pack, then gives away "
         f"{sold} {item}. {name} shares as many of the remaining {item} as possible equally among {people} "
         f"friends. How many {item} does each friend get, and how many are left over?")
    a = (f"Step 1: {s1} {item} from the packs.\nStep 2: {s2} {item} in total.\nStep 3: {s3} {item} after "
         f"giving some away.\nStep 4: {left} leaves {left % people} over when split into {people} equal parts, "
         f"so {s4}.\nAnswer: each friend gets {share} {item} and {left % people} are left over.")
    msgs = [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    if rng.random() < 0.5:
        msgs.insert(0, {"role": "system", "content": rng.choice(SYSTEMS)})
    return {"messages": msgs}


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _instruction(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(6)
    if kind == 0:
        s = _sentence(rng, rng.randint(6, 14))
        return f"Rewrite this sentence in uppercase letters only: {s}", s.upper()
    if kind == 1:
        n = rng.randint(3, 7)
        picks = rng.sample(CITIES, n)
        return (f"List exactly {n} cities as bullet points, each line starting with '- ', and nothing else.",
                "\n".join(f"- {c}" for c in picks))
    if kind == 2:
        name, age, city = rng.choice(NAMES), rng.randint(18, 90), rng.choice(CITIES)
        return (f'{name} is {age} years old and lives in {city}. Reply only with a JSON object with the keys '
                f'"name", "age" and "city".', json.dumps({"name": name, "age": age, "city": city}))
    if kind == 3:
        nums = [rng.randint(-50, 500) for _ in range(rng.randint(5, 12))]
        return (f"Sort these numbers in ascending order and reply with them comma-separated: "
                f"{', '.join(map(str, nums))}", ", ".join(map(str, sorted(nums))))
    if kind == 4:
        s = _sentence(rng, rng.randint(5, 12))
        return (f"Reverse the order of the words in this sentence and reply with the result only: {s}",
                " ".join(reversed(s.split())))
    s = _sentence(rng, rng.randint(4, 20))
    return f"How many words are in this sentence? Answer with a single number. Sentence: {s}", str(len(s.split()))


def _instructions(rng: random.Random) -> dict:
    conv = []
    if rng.random() < 0.3:
        conv.append({"from": "system", "value": SYSTEMS[2]})
    for _ in range(rng.choice([1, 1, 2])):
        q, a = _instruction(rng)
        conv += [{"from": "human", "value": q}, {"from": "gpt", "value": a}]
    return {"conversations": conv}


def _chat(rng: random.Random) -> dict:
    kind = rng.randrange(3)
    turns = []
    if kind == 0:
        h = rng.randint(2, 30)
        turns = [(f"How many minutes are in {h} hours?", f"{h} hours × 60 = {h * 60} minutes."),
                 ("And how many seconds is that?", f"{h * 60} minutes × 60 = {h * 3600} seconds."),
                 (f"What if it were {h + 1} hours instead?",
                  f"{h + 1} hours is {(h + 1) * 60} minutes, or {(h + 1) * 3600} seconds.")]
    elif kind == 1:
        base, want = rng.choice([2, 4]), rng.choice([3, 6, 8, 10, 12])
        flour, eggs, milk = rng.choice([200, 250, 300]), rng.choice([2, 3, 4]), rng.choice([100, 200, 300])
        f2, e2, m2 = flour * want // base, eggs * want / base, milk * want // base
        turns = [(f"A pancake recipe for {base} people needs {flour} g flour, {eggs} eggs and {milk} ml milk. "
                  f"How much do I need for {want} people?",
                  f"Multiply everything by {want}/{base}: {f2} g flour, {e2:g} eggs and {m2} ml milk."),
                 ("Thanks! Any tip for fluffy pancakes?",
                  "Let the batter rest for about 10 minutes and cook on medium heat; flip when bubbles form.")]
    else:
        a, b = rng.sample(sorted(CAPITALS), 2)
        longer = a if len(CAPITALS[a]) >= len(CAPITALS[b]) else b
        turns = [(f"What is the capital of {a}?", f"The capital of {a} is {CAPITALS[a]}."),
                 (f"And of {b}?", f"The capital of {b} is {CAPITALS[b]}."),
                 ("Which of the two capitals has the longer name?",
                  f"{CAPITALS[longer]} ({len(CAPITALS[longer])} letters) is longer than "
                  f"{CAPITALS[b if longer == a else a]} ({len(CAPITALS[b if longer == a else a])} letters).")]
    msgs = [{"role": "system", "content": SYSTEMS[0]}] if rng.random() < 0.5 else []
    for q, a in turns[:rng.randint(2, len(turns))]:
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return {"messages": msgs}


TOOLS = {
    "get_weather": ({"city": {"type": "string", "description": "city name"},
                     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"],
                    "Current weather for a city."),
    "convert_currency": ({"amount": {"type": "number"}, "from": {"type": "string"}, "to": {"type": "string"}},
                         ["amount", "from", "to"], "Convert an amount between currencies."),
    "count_stock": ({"item": {"type": "string"}}, ["item"], "How many of an item are in stock."),
}
RATES = {("EUR", "USD"): 1.08, ("USD", "EUR"): 0.93, ("GBP", "EUR"): 1.17, ("JPY", "USD"): 0.0067}


def _tool_schema(name: str) -> dict:
    props, required, desc = TOOLS[name]
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": props, "required": required}}}


def _tools(rng: random.Random, i: int) -> dict:
    name = rng.choice(sorted(TOOLS))
    if name == "get_weather":
        city, temp = rng.choice(CITIES), rng.randint(-5, 35)
        args, result = {"city": city, "unit": "celsius"}, {"city": city, "temperature": temp, "sky": rng.choice(
            ["sunny", "cloudy", "rainy"])}
        q, final = (f"What's the weather like in {city} right now?",
                    f"It is {temp}°C and {result['sky']} in {city}.")
    elif name == "convert_currency":
        (src, dst), amount = rng.choice(sorted(RATES)), rng.randint(5, 5000)
        value = round(amount * RATES[(src, dst)], 2)
        args, result = {"amount": amount, "from": src, "to": dst}, {"value": value, "currency": dst}
        q, final = f"How much is {amount} {src} in {dst}?", f"{amount} {src} is about {value:.2f} {dst}."
    else:
        item, n = rng.choice(ITEMS), rng.randint(0, 400)
        args, result = {"item": item}, {"item": item, "in_stock": n}
        q, final = (f"Do we still have {item} in stock?",
                    f"Yes, there are {n} {item} in stock." if n else f"No, {item} are out of stock.")
    call_id = f"call_{i}"
    tools = [_tool_schema(n) for n in sorted({name, rng.choice(sorted(TOOLS))})]
    return {"tools": tools, "messages": [
        {"role": "system", "content": "You can call tools. Use them when they help."},
        {"role": "user", "content": q},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]},
        {"role": "tool", "tool_call_id": call_id, "name": name, "content": json.dumps(result)},
        {"role": "assistant", "content": final}]}


def _long_report(rng: random.Random) -> dict:
    cats = rng.sample(["tools", "paint", "garden", "kitchen", "lighting", "storage"], 4)
    rows = []
    for k in range(rng.randint(40, 55)):
        rows.append((f"item-{k + 1:03d}", rng.choice(cats), rng.randint(1, 90), rng.randint(1, 250)))
    table = "\n".join(f"{n} | {c} | {q} | {p}" for n, c, q, p in rows)
    q = ("Here is our inventory as 'item | category | quantity | unit price in euros'.\n" + table +
         "\nFor each category, give the total quantity and the total value, then name the most valuable line.")
    lines = []
    for c in sorted(cats):
        sel = [r for r in rows if r[1] == c]
        lines.append(f"- {c}: {len(sel)} lines, quantity {sum(r[2] for r in sel)}, "
                     f"value {sum(r[2] * r[3] for r in sel)} euros")
    top = max(rows, key=lambda r: (r[2] * r[3], r[0]))
    a = ("Totals per category:\n" + "\n".join(lines) + f"\nThe most valuable line is {top[0]} ({top[1]}): "
         f"{top[2]} × {top[3]} = {top[2] * top[3]} euros.\nOverall value: {sum(r[2] * r[3] for r in rows)} euros.")
    return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}


def _coding(rng: random.Random) -> dict:
    name, arg, returns, body = rng.choice(CODE_TASKS)
    style = rng.randrange(3)
    if style == 0:
        q = f"Write a Python function `{name}({arg})` that returns {returns}."
    elif style == 1:
        q = f"Implement {name}({arg}) in Python. It should return {returns}. Include a docstring."
    else:
        q = f"I need a small Python helper called {name} taking {arg}; it returns {returns}. Can you write it?"
    doc = f'    """Return {returns}."""\n' if style == 1 else ""
    a = (f"Here is the function:\n\n```python\ndef {name}({arg}):\n{doc}    {body}\n```\n\n"
         f"It returns {returns}.")
    return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}


def _records(name: str, n: int, seed: int) -> list[dict]:
    rng = random.Random(f"{seed}:{name}")  # str seeds are hashed with sha512: stable across runs
    make = {"arithmetic": _arithmetic, "instructions": _instructions, "chat": _chat,
            "long_reports": _long_report, "coding": _coding, "code_completion": code_completion}.get(name)
    return [make(rng) if make else _tools(rng, i) for i in range(n)]


def _jsonl(records: list[dict], bad_lines: bool) -> bytes:
    lines = [json.dumps(r, ensure_ascii=False) for r in records]
    if bad_lines and len(lines) > 4:
        # Deliberately bad, for the rejects path: a cut-off JSON line and an empty human turn.
        lines.insert(len(lines) // 3, '{"conversations": [{"from": "human", "value": "unfinished')
        lines.insert(2 * len(lines) // 3, json.dumps({"conversations": [
            {"from": "human", "value": ""}, {"from": "gpt", "value": "There is nothing to answer."}]}))
    return ("\n".join(lines) + "\n").encode()


def _parquet(records: list[dict]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table({"messages": [r["messages"] for r in records]}), buf, compression="zstd")
    return buf.getvalue()


def write_demo_corpus(out: str, scale: float = 1, seed: int = DEFAULT_SEED, regenerate: tuple[str, ...] = (),
                      more: dict[str, float] | None = None) -> str:
    """Write the demo datasets and manifest.yaml under `out`; returns the manifest's URI.

    Datasets named in `regenerate` get `regenerate: true`: the DAG replaces their
    answers with the target's own before tokenizing. `more` multiplies some datasets'
    sample counts on top of `scale` (the demo's more data on a bf16 machine).
    """
    more = dict(more or {})
    unknown = sorted(set(regenerate) - set(DATASETS))
    if unknown:
        raise InputError(f"--regenerate names unknown dataset(s) {unknown}; demo datasets: {sorted(DATASETS)}")
    unknown = sorted(set(more) - set(DATASETS))
    if unknown:
        raise InputError(f"--more names unknown dataset(s) {unknown}; demo datasets: {sorted(DATASETS)}")
    if scale <= 0 or any(f <= 0 for f in more.values()):
        raise InputError(f"scale and --more factors must be > 0, got scale {scale!r}, more {more} "
                         "(e.g. --scale 1 --more code_completion=3)")
    entries = []
    for name, (base, fmt, rel, category) in DATASETS.items():
        records = _records(name, max(1, round(base * scale * more.get(name, 1.0))), seed)
        if rel.endswith(".parquet"):
            data = _parquet(records)
        else:
            data = _jsonl(records, bad_lines=name == "instructions")
            if rel.endswith(".gz"):  # mtime=0 and no file name: the same bytes on every run
                data = gzip.compress(data, mtime=0)
        storage.write_bytes(storage.join(out, rel), data)
        entries.append({"name": name, "source": rel, "format": fmt, "category": category,
                        **({"regenerate": True} if name in regenerate else {})})
    import yaml

    extra = "".join(f" --more {k}={v:g}" for k, v in sorted(more.items()))
    text = (f"# Demo corpus written by `eagle3 demo-data --scale {scale:g} --seed {seed}{extra}`.\n"
            "# Answers are computed by code; long_reports plays the seed's A1 (few samples, many tokens).\n"
            + yaml.safe_dump({"datasets": entries}, sort_keys=False))
    manifest = storage.join(out, "manifest.yaml")
    storage.write_text(manifest, text)
    return manifest


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="folder to write data/ and manifest.yaml into (local or s3://)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every dataset's sample count (default 1)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"seed of the generator (default {DEFAULT_SEED})")
    p.add_argument("--regenerate", default="", help="comma-separated datasets to mark `regenerate: true`")
    p.add_argument("--more", action="append", default=[], metavar="NAME=X",
                   help="multiply one dataset's sample count by X on top of --scale (repeatable), e.g. "
                        "--more code_completion=3")


def parse_more(items: list[str]) -> dict[str, float]:
    """--more NAME=X options as {name: factor}; a malformed one is an InputError naming it and the fix."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise InputError(f"--more {item!r}: write NAME=FACTOR, e.g. --more code_completion=3")
    return out


def run(args: argparse.Namespace) -> int:
    names = tuple(n for n in args.regenerate.split(",") if n)
    print(write_demo_corpus(args.out, scale=args.scale, seed=args.seed, regenerate=names,
                            more=parse_more(args.more)))
    return 0
