"""Write the small real-format data sets under postrl/data/ that the tests, recipes and examples use.

    .venv/bin/python scripts/make_data_fixtures.py

gsm_symbolic_{train,test}.jsonl  GSM8K format (question; answer = worked solution + `#### N`),
                                 exported from reasoning-gym's gsm_symbolic (`postrl export-rg`),
                                 train seed 1, test seed 2; questions in both are dropped from train
mbpp_style.jsonl                 MBPP format (text, code, test_list of assert lines), hand-written
choice.jsonl                     multiple choice (question, options, answer letter), hand-written

The output is fixed: running it again rewrites the same bytes (tests/test_dataset_domain.py checks
that the GSM files are what the exporter makes).
"""

from __future__ import annotations

from pathlib import Path

from _data_files import write_jsonl  # scripts/, on the path when this script runs

from postrl.commands.export_rg import export_rows

DATA = Path(__file__).resolve().parents[1] / "postrl" / "data"
GSM = {"train": (1, 80), "test": (2, 40)}  # split -> (seed, problems)

MBPP = [
    ("Write a function to add two integers.", "def add(a, b):\n    return a + b",
     ["assert add(1, 2) == 3", "assert add(-4, 4) == 0", "assert add(10, 5) == 15"]),
    ("Write a function to find the maximum of three numbers.", "def max_of_three(a, b, c):\n    return max(a, b, c)",
     ["assert max_of_three(1, 2, 3) == 3", "assert max_of_three(7, 2, 5) == 7", "assert max_of_three(-1, -5, -3) == -1"]),
    ("Write a function to reverse a string.", "def reverse_string(s):\n    return s[::-1]",
     ["assert reverse_string('abc') == 'cba'", "assert reverse_string('') == ''", "assert reverse_string('racecar') == 'racecar'"]),
    ("Write a function to check whether a number is even.", "def is_even(n):\n    return n % 2 == 0",
     ["assert is_even(4) == True", "assert is_even(7) == False", "assert is_even(0) == True"]),
    ("Write a function to count the vowels in a string.",
     "def count_vowels(s):\n    return sum(1 for c in s.lower() if c in 'aeiou')",
     ["assert count_vowels('hello') == 2", "assert count_vowels('xyz') == 0", "assert count_vowels('AEIOU') == 5"]),
    ("Write a function to compute the factorial of n.",
     "def factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result",
     ["assert factorial(0) == 1", "assert factorial(5) == 120", "assert factorial(6) == 720"]),
    ("Write a function to return the sum of a list of numbers.", "def list_sum(xs):\n    return sum(xs)",
     ["assert list_sum([1, 2, 3]) == 6", "assert list_sum([]) == 0", "assert list_sum([-1, 1, 10]) == 10"]),
    ("Write a function to find the square of each number in a list.", "def squares(xs):\n    return [x * x for x in xs]",
     ["assert squares([1, 2, 3]) == [1, 4, 9]", "assert squares([]) == []", "assert squares([-2]) == [4]"]),
    ("Write a function to remove duplicates from a list, keeping the first occurrence of each item.",
     "def dedupe(xs):\n    seen = []\n    for x in xs:\n        if x not in seen:\n            seen.append(x)\n    return seen",
     ["assert dedupe([1, 2, 1, 3, 2]) == [1, 2, 3]", "assert dedupe([]) == []", "assert dedupe(['a', 'a']) == ['a']"]),
    ("Write a function to check whether a string is a palindrome.", "def is_palindrome(s):\n    return s == s[::-1]",
     ["assert is_palindrome('level') == True", "assert is_palindrome('python') == False", "assert is_palindrome('a') == True"]),
    ("Write a function to find the nth Fibonacci number, with fib(0) = 0 and fib(1) = 1.",
     "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
     ["assert fib(0) == 0", "assert fib(1) == 1", "assert fib(10) == 55"]),
    ("Write a function to find the area of a circle of radius r.",
     "import math\ndef circle_area(r):\n    return math.pi * r * r",
     ["import math", "assert math.isclose(circle_area(1), 3.141592653589793)", "assert circle_area(0) == 0"]),
]

CHOICE = [
    ("What is 7 + 5?", ["10", "12", "13", "11"], "B"),
    ("Which planet is closest to the Sun?", ["Venus", "Earth", "Mercury", "Mars"], "C"),
    ("What is the chemical symbol for water?", ["H2O", "CO2", "O2", "NaCl"], "A"),
    ("How many sides does a hexagon have?", ["5", "8", "7", "6"], "D"),
    ("What is 9 x 6?", ["54", "56", "45", "63"], "A"),
    ("Which of these is a prime number?", ["21", "27", "29", "33"], "C"),
    ("What is the boiling point of water at sea level in degrees Celsius?", ["90", "100", "110", "120"], "B"),
    ("Which number is the largest?", ["0.5", "0.45", "0.405", "0.55"], "D"),
    ("What is half of 3/4?", ["3/8", "3/2", "1/4", "2/3"], "A"),
    ("How many minutes are in 2 hours?", ["100", "60", "120", "200"], "C"),
    ("Which gas do plants absorb from the air for photosynthesis?", ["Oxygen", "Carbon dioxide", "Nitrogen", "Helium"], "B"),
    ("What is 15% of 200?", ["15", "20", "25", "30"], "D"),
]


def gsm_rows() -> dict[str, list[dict]]:
    splits = {name: export_rows("gsm_symbolic", n, seed, gsm8k=True, metadata=False) for name, (seed, n) in GSM.items()}
    test_questions = {r["question"] for r in splits["test"]}
    splits["train"] = [r for r in splits["train"] if r["question"] not in test_questions]
    return splits


def main() -> None:
    for split, rows in gsm_rows().items():
        write_jsonl(DATA / f"gsm_symbolic_{split}.jsonl", rows)
    write_jsonl(DATA / "mbpp_style.jsonl", [{"task_id": i + 1, "text": text, "code": code, "test_list": tests}
                                            for i, (text, code, tests) in enumerate(MBPP)])
    write_jsonl(DATA / "choice.jsonl", [
        {"question": q, "options": "\n".join(f"{'ABCD'[i]}) {o}" for i, o in enumerate(opts)), "answer": a}
        for q, opts, a in CHOICE])


if __name__ == "__main__":
    main()
