"""A failure's reason keeps the lines that say why (issue 37): a library's first line rarely does — xformers'
"No operator found … with inputs:" has its why lines further down — without the noise, on one line, capped."""

from __future__ import annotations

from pathlib import Path

import attnbench
from attnbench.errors import REASON_CHARS, one_line, raised_in, reason
from attnbench.runner.cases import RunOptions, run_case
from attnbench.workload import Workload

# What xformers 0.0.35's dispatch raises on an H100 under torch 2.11.0+cu130 (its _run_priority_list and
# _format_not_supported_reasons): a headline, the inputs, then each operator and why it is not supported.
NO_OPERATOR = """No operator found for `memory_efficient_attention_forward` with inputs:
     query       : shape=(2, 1024, 2, 4, 64) (torch.bfloat16)
     key         : shape=(2, 1024, 2, 4, 64) (torch.bfloat16)
     value       : shape=(2, 1024, 2, 4, 64) (torch.bfloat16)
     attn_bias   : <class 'xformers.ops.fmha.attn_bias.LowerTriangularMask'>
     p           : 0.0
`fa3F@0.0.0` is not supported because:
    xFormers wasn't build with CUDA support
    operator wasn't built - see `python -m xformers.info` for more info
`fa2F@2.7.4-pt` is not supported because:
    xFormers wasn't build with CUDA support
`cutlassF-pt` is not supported because:
    xFormers wasn't build with CUDA support"""
HEADLINE = "NotImplementedError: No operator found for `memory_efficient_attention_forward` with inputs:"


def test_xformers_no_operator_error_keeps_the_lines_that_say_why():
    text = reason(NotImplementedError(NO_OPERATOR))
    fa3 = "`fa3F@0.0.0` is not supported because: xFormers wasn't build with CUDA support"
    assert text.startswith(f"{HEADLINE} {fa3}; operator wasn't built - see `python -m xformers.info` for more info;")
    assert "`fa2F@2.7.4-pt` is not supported because: xFormers wasn't build with CUDA support" in text
    assert "\n" not in text and "shape=" not in text and "attn_bias" not in text  # the inputs are the row's columns
    assert len(text) <= REASON_CHARS and text.endswith("…")  # the third operator is cut, with an ellipsis
    without_fa3 = NO_OPERATOR.replace(NO_OPERATOR[NO_OPERATOR.index("`fa3F") : NO_OPERATOR.index("`fa2F")], "")
    assert reason(NotImplementedError(without_fa3)) == (
        f"{HEADLINE} `fa2F@2.7.4-pt` is not supported because: xFormers wasn't build with CUDA support; "
        "`cutlassF-pt` is not supported because: xFormers wasn't build with CUDA support"
    )


def test_torch_noise_paths_blank_and_repeated_lines_are_dropped():
    message = (
        "CUDA error: an illegal memory access was encountered "
        "(Triggered internally at /pytorch/c10/cuda/CUDAException.cpp:43.)\n"
        "Exception raised from c10_cuda_check_implementation at /pytorch/c10/cuda/CUDAException.cpp:44 "
        "(most recent call first):\n"
        "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x98 (0x7f3c2c in /torch/lib/libc10.so)\n"
        "frame #1: c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, int, bool) + 0x3c\n"
        "\n"
        "CUDA kernel errors might be asynchronously reported at some other API call.\n"
        "CUDA kernel errors might be asynchronously reported at some other API call.\n"
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions at /pytorch/c10/cuda/CUDAException.cpp:44."
    )
    assert reason(RuntimeError(message)) == (
        "RuntimeError: CUDA error: an illegal memory access was encountered; "
        "CUDA kernel errors might be asynchronously reported at some other API call; "
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."
    )
    traceback = """Traceback (most recent call last):
  File "/work/kernel.py", line 12, in run
    out = kernel[grid](q, k, v)
          ~~~~~~~~~~~~^^^^^^^^^
ValueError: BLOCK_M must divide 96 (kernel.py:40:8)"""
    assert one_line(traceback) == "ValueError: BLOCK_M must divide 96"
    assert reason(RuntimeError()) == "RuntimeError" and reason(KeyError("k")) == "KeyError: 'k'"
    long = reason(RuntimeError("word " * 200))
    assert len(long) <= REASON_CHARS and long.endswith("word…")


def test_an_error_row_keeps_the_operators_reasons(planted):
    class NoOperator(attnbench.Contender):
        name = "planted_no_operator"
        capabilities = attnbench.Capabilities(devices=frozenset({"cpu"}))

        def prepare(self, inputs, workload):
            def run():
                raise NotImplementedError(NO_OPERATOR)

            return run

    attnbench.register(NoOperator())
    planted.append(NoOperator.name)
    row = run_case(NoOperator.name, Workload(1, 2, 2, 8, 8, 4), RunOptions(budget_s=0.01, measure_memory=False))
    where = f" (raised in run, test_reasons.py:{_line_of('raise NotImplementedError(NO_OPERATOR)')})"
    assert row["status"] == "error" and row["reason"].endswith(where) and len(row["reason"]) <= REASON_CHARS
    assert row["reason"] == reason(NotImplementedError(NO_OPERATOR), REASON_CHARS - len(where)) + where
    assert "is not supported because: xFormers wasn't build with CUDA support" in row["reason"]


def _line_of(text: str) -> int:
    """The line of this file that holds ``text``."""
    return next(n for n, line in enumerate(Path(__file__).read_text().splitlines(), 1) if text in line)


def _scores(q, k):
    return q @ k[..., :3].transpose(-1, -2)  # the author's bug: torch raises a shape mismatch in its matmul


def test_an_error_row_names_the_line_of_the_contenders_own_code_that_failed(planted):
    """An author whose kernel raises (here torch's matmul, called from a helper of the kernel's module) is told the
    line of their own code nearest the failure: torch's message has no location of theirs, and torch's own frames
    are not theirs. A failure of code outside the contender's package (attnbench's) names no line."""

    class ShapeBug(attnbench.Contender):
        name = "planted_shape_bug"
        capabilities = attnbench.Capabilities(devices=frozenset({"cpu"}))

        def prepare(self, inputs, workload):
            return lambda: _scores(inputs.q, inputs.k)

    class NotCallable(attnbench.Contender):
        name = "planted_not_callable"
        capabilities = attnbench.Capabilities(devices=frozenset({"cpu"}))

        def prepare(self, inputs, workload):
            return 3  # attnbench's call of it raises, in attnbench's code

    for contender in (ShapeBug(), NotCallable()):
        attnbench.register(contender)
        planted.append(contender.name)
    options = RunOptions(budget_s=0.01, measure_memory=False)
    row = run_case(ShapeBug.name, Workload(1, 2, 2, 8, 8, 4), options)
    assert row["status"] == "error" and row["reason"].startswith("RuntimeError: ")
    assert row["reason"].endswith(f" (raised in _scores, test_reasons.py:{_line_of('k[..., :3]')})")
    row = run_case(NotCallable.name, Workload(1, 2, 2, 8, 8, 4), options)
    assert row["status"] == "error" and "raised in" not in row["reason"]


def _kernel_line(q):
    raise AssertionError("input and other must have equal reduction dimensions")


def _launch(q):
    """A library's launcher (Triton's interpreter) that wraps the kernel's error in its own."""
    try:
        _kernel_line(q)
    except AssertionError as exc:
        raise RuntimeError(f"InterpreterError: {exc!r}") from exc


def test_a_wrapped_error_names_the_line_of_its_cause():
    """Triton's interpreter raises InterpreterError from the kernel's AssertionError: the line named is the
    kernel's (the cause's deepest frame in the package), not the launch's."""
    try:
        _launch(None)
    except RuntimeError as exc:
        where = raised_in(exc, __name__)
    assert where == f"_kernel_line, test_reasons.py:{_line_of('raise AssertionError(')}"
