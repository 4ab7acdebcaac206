"""Train from Python: rows of your own and a reward function of your own, TRL-style.

    python examples/train_with_python.py                     # 2 steps on the built-in tiny model
    python examples/train_with_python.py --model DIR --steps 20
"""

import argparse

import postrl

ROWS = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a in range(10, 50, 3) for b in range(11, 50, 4)]


def digits_only(prompts, completions, answer, **columns):
    """A shaping reward next to the verifier's: 0.1 for a reply that is a bare number."""
    return [0.1 if c.strip().isdigit() else 0.0 for c in completions]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny-arith")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--run-dir", default="")
    args = parser.parse_args()
    recipe = {
        "model": {"name": args.model},
        "domains": {"sums": {"type": "dataset", "params": {
            "prompt": "{question}", "answer": "answer", "verifier": "exact", "extract": "last_number",
            "heldout_percent": 20}}},
        "train": {"total_steps": args.steps, "prompts_per_step": 4, "samples_per_prompt": 4},
        "eval": {"num_problems": 8, "samples_per_problem": 2, "k": [1]},
        "run": {"dir": args.run_dir, "progress": False},
    }
    run_dir = postrl.train(recipe, datasets={"sums": ROWS}, reward_funcs=[digits_only])
    print(postrl.evaluate(run_dir, recipe=run_dir / "config.yaml"))


if __name__ == "__main__":
    main()
