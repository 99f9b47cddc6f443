"""Shared argv builder for the eval CLI tests (a uniquely named module: importable whatever the test order)."""


def eval_argv(model, data, out, *extra):
    return ["eval", "--model", str(model), "--dataset", str(data), "--prompt-field", "question", "--answer-field",
            "solution", "--gold-format", "boxed", "-k", "2", "--max-new-tokens", "6", "--batch-size", "4",
            "--verify-workers", "1", "--n-boot", "20", "--no-progress", "--out", str(out), *extra]
