"""Function stubs for the demo's `code_completion` dataset: typed signature, docstring, doctests.

HumanEval (the held-out benchmark) asks an instruct model to complete a typed
Python function from its docstring. A draft only learns that style if it sees
it, so this module writes stubs of the same *shape* for tasks of its own: each
family below has a reference implementation that computes the doctest outputs
and the code-only answer. Names, argument names, phrasings and example inputs
are drawn at random, so prompts rarely repeat. Nothing here is taken from
HumanEval.
"""

from __future__ import annotations

import dataclasses
import random
import re
from dataclasses import dataclass
from typing import Any, Callable

# How a user asks for the completion (the benchmark's own wording is one of them).
INSTRUCTIONS = [
    "Complete the following Python function. Reply with the code only.\n\n",
    "Finish this Python function so that it passes its doctests.\n\n",
    "Write the body of the function below.\n\n",
    "Implement the following function in Python.\n\n",
]


@dataclass(frozen=True)
class Family:
    names: tuple[str, ...]
    args: str  # typed parameters, e.g. "numbers: List[int], k: int"
    returns: str  # return annotation
    doc: str  # docstring's first sentences
    body: str  # reference body (indented by 4)
    fn: Callable[..., Any]
    example: Callable[[random.Random], tuple]  # random arguments for one doctest


def _ints(rng: random.Random, lo: int = -9, hi: int = 20, n: tuple[int, int] = (3, 7)) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(*n))]


def _word(rng: random.Random) -> str:
    return rng.choice(["apple", "river", "stone", "cloud", "tiger", "lemon", "paper", "night", "green", "house",
                       "level", "radar", "moon", "sky", "data", "code", "bread", "north", "eagle", "piano"])


def _sentence(rng: random.Random) -> str:
    return " ".join(_word(rng) for _ in range(rng.randint(2, 5)))


def _collatz(n: int) -> int:
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


FAMILIES = [
    Family(("sum_positive", "positive_total", "add_positives"), "numbers: List[int]", "int",
           "Return the sum of the positive numbers in the list.",
           "return sum(x for x in numbers if x > 0)", lambda xs: sum(x for x in xs if x > 0),
           lambda r: (_ints(r),)),
    Family(("count_negatives", "negatives_count"), "numbers: List[int]", "int",
           "Return how many numbers in the list are negative.",
           "return sum(1 for x in numbers if x < 0)", lambda xs: sum(1 for x in xs if x < 0),
           lambda r: (_ints(r),)),
    Family(("max_difference", "largest_spread", "value_range"), "numbers: List[int]", "int",
           "Return the difference between the largest and the smallest number.\n    The list is not empty.",
           "return max(numbers) - min(numbers)", lambda xs: max(xs) - min(xs), lambda r: (_ints(r),)),
    Family(("keep_first_occurrences", "unique_in_order", "dedupe"), "numbers: List[int]", "List[int]",
           "Return the numbers without repeats, keeping the first occurrence of each.",
           "seen = set()\n    out = []\n    for x in numbers:\n        if x not in seen:\n            seen.add(x)\n"
           "            out.append(x)\n    return out",
           lambda xs: list(dict.fromkeys(xs)), lambda r: (_ints(r, 0, 5, (4, 8)),)),
    Family(("running_max", "prefix_maximum"), "numbers: List[int]", "List[int]",
           "Return a list where item i is the largest of numbers[0..i].",
           "out = []\n    best = None\n    for x in numbers:\n        best = x if best is None else max(best, x)\n"
           "        out.append(best)\n    return out",
           lambda xs: [max(xs[:i + 1]) for i in range(len(xs))], lambda r: (_ints(r),)),
    Family(("pairwise_sums", "neighbour_sums"), "numbers: List[int]", "List[int]",
           "Return the sums of each pair of neighbouring numbers.",
           "return [a + b for a, b in zip(numbers, numbers[1:])]",
           lambda xs: [a + b for a, b in zip(xs, xs[1:])], lambda r: (_ints(r),)),
    Family(("filter_above", "greater_than", "keep_large"), "numbers: List[int], threshold: int", "List[int]",
           "Return the numbers that are strictly greater than threshold, in order.",
           "return [x for x in numbers if x > threshold]", lambda xs, t: [x for x in xs if x > t],
           lambda r: (_ints(r), r.randint(0, 10))),
    Family(("count_multiples", "multiples_of"), "numbers: List[int], k: int", "int",
           "Return how many numbers in the list are divisible by k.",
           "return sum(1 for x in numbers if x % k == 0)", lambda xs, k: sum(1 for x in xs if x % k == 0),
           lambda r: (_ints(r, 1, 30), r.randint(2, 5))),
    Family(("rotate_left", "shift_list"), "items: List[int], k: int", "List[int]",
           "Rotate the list k places to the left and return it.",
           "if not items:\n        return []\n    k %= len(items)\n    return items[k:] + items[:k]",
           lambda xs, k: xs[k % len(xs):] + xs[:k % len(xs)], lambda r: (_ints(r, 0, 9), r.randint(1, 4))),
    Family(("is_non_decreasing", "in_ascending_order"), "numbers: List[int]", "bool",
           "Return True if the numbers are in non-decreasing order.",
           "return all(a <= b for a, b in zip(numbers, numbers[1:]))",
           lambda xs: all(a <= b for a, b in zip(xs, xs[1:])),
           lambda r: (sorted(_ints(r)) if r.random() < 0.5 else _ints(r),)),
    Family(("mean_value", "average"), "numbers: List[float]", "float",
           "Return the arithmetic mean of the numbers. The list is not empty.",
           "return sum(numbers) / len(numbers)", lambda xs: sum(xs) / len(xs),
           lambda r: ([float(x) for x in _ints(r, 0, 10, (2, 4))],)),
    Family(("second_smallest", "runner_up_min"), "numbers: List[int]", "Optional[int]",
           "Return the second smallest distinct number, or None if there is none.",
           "distinct = sorted(set(numbers))\n    return distinct[1] if len(distinct) > 1 else None",
           lambda xs: sorted(set(xs))[1] if len(set(xs)) > 1 else None, lambda r: (_ints(r, 0, 6, (2, 6)),)),
    Family(("product_of_digits", "digit_product"), "n: int", "int",
           "Return the product of the decimal digits of the non-negative integer n.",
           "result = 1\n    for d in str(n):\n        result *= int(d)\n    return result",
           lambda n: eval("*".join(str(n))), lambda r: (r.randint(1, 9999),)),
    Family(("count_divisors", "number_of_divisors"), "n: int", "int",
           "Return how many positive integers divide n exactly.",
           "return sum(1 for d in range(1, n + 1) if n % d == 0)",
           lambda n: sum(1 for d in range(1, n + 1) if n % d == 0), lambda r: (r.randint(1, 60),)),
    Family(("prime_check", "check_prime"), "n: int", "bool",
           "Return True if n is a prime number.",
           "if n < 2:\n        return False\n    for d in range(2, int(n ** 0.5) + 1):\n        if n % d == 0:\n"
           "            return False\n    return True",
           lambda n: n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1)), lambda r: (r.randint(0, 50),)),
    Family(("collatz_steps", "steps_to_one"), "n: int", "int",
           "Return how many Collatz steps it takes to reach 1 from the positive integer n.\n"
           "    A step halves an even number and maps an odd number x to 3 * x + 1.",
           "steps = 0\n    while n != 1:\n        n = n // 2 if n % 2 == 0 else 3 * n + 1\n        steps += 1\n"
           "    return steps", _collatz, lambda r: (r.randint(1, 30),)),
    Family(("triangle_number", "nth_triangular"), "n: int", "int",
           "Return the n-th triangular number, the sum 1 + 2 + ... + n.",
           "return n * (n + 1) // 2", lambda n: n * (n + 1) // 2, lambda r: (r.randint(0, 40),)),
    Family(("gcd_of", "greatest_common_divisor_of"), "a: int, b: int", "int",
           "Return the greatest common divisor of two positive integers.",
           "while b:\n        a, b = b, a % b\n    return a", _gcd, lambda r: (r.randint(2, 90), r.randint(2, 90))),
    Family(("reverse_words", "words_backwards"), "sentence: str", "str",
           "Return the sentence with its words in reverse order.",
           "return ' '.join(reversed(sentence.split()))", lambda s: " ".join(reversed(s.split())),
           lambda r: (_sentence(r),)),
    Family(("count_vowels_in", "vowel_count"), "text: str", "int",
           "Return how many vowels (a, e, i, o, u) the lower-case text contains.",
           "return sum(1 for ch in text if ch in 'aeiou')", lambda s: sum(1 for c in s if c in "aeiou"),
           lambda r: (_sentence(r),)),
    Family(("is_palindrome_word", "reads_same_backwards"), "word: str", "bool",
           "Return True if the word reads the same forwards and backwards.",
           "return word == word[::-1]", lambda s: s == s[::-1], lambda r: (_word(r),)),
    Family(("longest_word", "longest_token"), "sentence: str", "str",
           "Return the longest word of the sentence; the first one on a tie.",
           "return max(sentence.split(), key=len)", lambda s: max(s.split(), key=len), lambda r: (_sentence(r),)),
    Family(("title_case", "capitalize_each"), "sentence: str", "str",
           "Return the sentence with the first letter of every word in upper case.",
           "return ' '.join(w[:1].upper() + w[1:] for w in sentence.split())",
           lambda s: " ".join(w[:1].upper() + w[1:] for w in s.split()), lambda r: (_sentence(r),)),
    Family(("char_frequency", "letter_counts"), "text: str", "Dict[str, int]",
           "Return a dictionary mapping each character of text to how often it occurs.",
           "counts = {}\n    for ch in text:\n        counts[ch] = counts.get(ch, 0) + 1\n    return counts",
           lambda s: {c: s.count(c) for c in dict.fromkeys(s)}, lambda r: (_word(r),)),
    Family(("remove_spaces", "strip_whitespace"), "text: str", "str",
           "Return the text with every space removed.",
           "return text.replace(' ', '')", lambda s: s.replace(" ", ""), lambda r: (_sentence(r),)),
    Family(("starts_with_vowel", "vowel_initial_words"), "words: List[str]", "List[str]",
           "Return the words that start with a vowel, in order.",
           "return [w for w in words if w[:1] in 'aeiou']", lambda ws: [w for w in ws if w[:1] in "aeiou"],
           lambda r: ([_word(r) for _ in range(r.randint(3, 6))],)),
    Family(("join_with_dash", "dash_join"), "words: List[str]", "str",
           "Return the words joined by a dash.",
           "return '-'.join(words)", lambda ws: "-".join(ws), lambda r: ([_word(r) for _ in range(r.randint(2, 4))],)),
    Family(("sort_by_length", "shortest_first"), "words: List[str]", "List[str]",
           "Return the words sorted by length, shortest first; equal lengths keep their order.",
           "return sorted(words, key=len)", lambda ws: sorted(ws, key=len),
           lambda r: ([_word(r) for _ in range(r.randint(3, 5))],)),
    Family(("caesar_shift", "shift_letters"), "text: str, shift: int", "str",
           "Shift every lower-case letter of text forward by shift places in the alphabet,\n"
           "    wrapping around from z to a. Other characters stay as they are.",
           "out = []\n    for ch in text:\n        if 'a' <= ch <= 'z':\n"
           "            out.append(chr((ord(ch) - ord('a') + shift) % 26 + ord('a')))\n        else:\n"
           "            out.append(ch)\n    return ''.join(out)",
           lambda s, k: "".join(chr((ord(c) - 97 + k) % 26 + 97) if "a" <= c <= "z" else c for c in s),
           lambda r: (_word(r), r.randint(1, 5))),
    Family(("binary_string", "to_binary"), "n: int", "str",
           "Return the binary representation of the non-negative integer n, without a prefix.",
           "return bin(n)[2:]", lambda n: bin(n)[2:], lambda r: (r.randint(0, 64),)),
    Family(("merge_sorted", "merge_two_lists"), "a: List[int], b: List[int]", "List[int]",
           "Merge two sorted lists into one sorted list.",
           "out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n"
           "            out.append(a[i])\n            i += 1\n        else:\n            out.append(b[j])\n"
           "            j += 1\n    return out + a[i:] + b[j:]",
           lambda a, b: sorted(a + b), lambda r: (sorted(_ints(r, 0, 20, (2, 4))), sorted(_ints(r, 0, 20, (2, 4))))),
    Family(("count_words", "word_count"), "sentence: str", "int",
           "Return the number of words in the sentence.",
           "return len(sentence.split())", lambda s: len(s.split()), lambda r: (_sentence(r),)),
]


def _call(family: Family, args: tuple) -> Any:
    return family.fn(*[list(a) if isinstance(a, list) else a for a in args])


# Names are mostly made up per prompt, so a draft cannot memorize them: it has to learn to
# copy the signature from the prompt, which is what the target does on HumanEval.
VERBS = ["compute", "get", "find", "count", "collect", "build", "make", "pick", "select", "measure", "scan",
         "check", "sum", "merge", "track", "fetch", "derive", "summarize", "extract", "gather", "rank", "tally",
         "load", "parse", "split", "join", "sort", "filter", "map", "reduce", "apply", "shift", "clip", "pack",
         "group", "match", "label", "score", "weigh", "trim", "align", "order", "mark", "sample", "probe", "tidy"]
NOUNS = ["values", "scores", "items", "totals", "records", "parts", "tokens", "entries", "readings", "points",
         "labels", "chunks", "steps", "marks", "levels", "ranges", "weights", "digits", "letters", "blocks",
         "samples", "rows", "pairs", "gaps", "peaks", "words", "codes", "limits", "orders", "prices", "grades",
         "events", "frames", "layers", "votes", "ticks", "bins", "slots", "lanes", "rounds", "cells", "seeds",
         "notes", "keys", "flags", "names", "tags", "runs", "hits", "bursts", "edges", "nodes", "paths", "spans"]
QUALIFIERS = ["", "", "", "all", "max", "min", "total", "first", "last", "even", "odd", "top", "unique", "valid",
              "sorted", "active", "raw", "daily", "net", "mean"]
# Made-up names that are HumanEval entry points (tests/demo_corpus checks none slips through).
HUMANEVAL_NAMES = frozenset({"select_words", "split_words"})
ARG_POOLS = {  # replacement names per argument kind; none clashes with a local name of a body
    "list": ["values", "data", "nums", "seq", "arr", "elements", "entries", "readings", "series", "inputs"],
    "int": ["limit", "count", "size", "bound", "amount", "step", "factor", "base"],
    "str": ["phrase", "line", "message", "string", "label", "source", "content", "passage"],
}


def _arg_kind(annotation: str) -> str | None:
    if annotation.startswith("List"):
        return "list"
    return {"int": "int", "str": "str"}.get(annotation)


def _renamed(fam: Family, rng: random.Random) -> dict[str, str]:
    """{old argument name: new name} for about half of the arguments (single letters a, b stay)."""
    out: dict[str, str] = {}
    for part in fam.args.split(", "):
        arg, annotation = part.split(": ")
        pool = ARG_POOLS.get(_arg_kind(annotation) or "", [])
        choices = [x for x in pool if x not in out.values() and x != arg]
        if arg not in ("a", "b") and choices and rng.random() < 0.5:
            out[arg] = rng.choice(choices)
    return out


def _rename(text: str, names: dict[str, str]) -> str:
    if not names:
        return text
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    return pattern.sub(lambda m: names[m.group(1)], text)


def _made_up_name(rng: random.Random) -> str:
    """verb[_qualifier]_noun: ~46,000 combinations, so names almost never repeat in a corpus."""
    return "_".join(p for p in (rng.choice(VERBS), rng.choice(QUALIFIERS), rng.choice(NOUNS)) if p)


def code_completion(rng: random.Random) -> dict:
    """One messages record: the user asks for a typed stub's body; the answer is the reference code."""
    fam = rng.choice(FAMILIES)
    if rng.random() < 0.25:
        name = rng.choice(fam.names)
    else:
        name = _made_up_name(rng)
        while name in HUMANEVAL_NAMES:
            name = _made_up_name(rng)
    names = _renamed(fam, rng)
    fam = dataclasses.replace(fam, args=_rename(fam.args, names), doc=_rename(fam.doc, names),
                              body=_rename(fam.body, names))
    examples = []
    for _ in range(rng.randint(1, 3)):
        args = fam.example(rng)
        call = ", ".join(repr(a) for a in args)
        result = _call(fam, args)
        if result is None:  # doctest prints nothing for None
            examples.append(f"    >>> {name}({call}) is None\n    True\n")
        else:
            examples.append(f"    >>> {name}({call})\n    {result!r}\n")
    typing_names = [t for t in ("List", "Dict", "Optional") if t in fam.args + fam.returns]
    header = f"from typing import {', '.join(typing_names)}\n\n\n" if typing_names else ""
    stub = f'{header}def {name}({fam.args}) -> {fam.returns}:\n    """{fam.doc}\n{"".join(examples)}    """\n'
    answer = f"```python\n{header}def {name}({fam.args}) -> {fam.returns}:\n    {fam.body}\n```"
    return {"messages": [{"role": "user", "content": rng.choice(INSTRUCTIONS) + stub},
                         {"role": "assistant", "content": answer}]}
