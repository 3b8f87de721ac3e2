"""The flags and defaults of failure containment. What they do is black-box HTTP in
``test_serve_rust_faults.py``: a failing step fails only its requests (500 naming the cause) and the
server keeps serving; ``--max-consecutive-step-failures`` failing steps in a row stop it with exit 1."""

from __future__ import annotations

from yoco_rs.serve.args import build_parser


def test_hardening_flags_and_a_shutdown_default_inside_the_kubernetes_grace_period():
    a = build_parser().parse_args([])
    assert a.shutdown_timeout + 5 < 30  # the drain and the connections' close fit the default 30 s grace
    assert (a.max_n, a.max_prompts_per_request, a.max_consecutive_step_failures) == (128, 256, 3)
    assert not a.trust_request_chat_template and not a.disable_fastapi_docs and a.allowed_origins is None
    a = build_parser().parse_args(["--max-n", "4", "--allowed-origins", "http://a", "http://b",
                                   "--trust-request-chat-template", "--disable-fastapi-docs",
                                   "--max-consecutive-step-failures", "5", "--chat-template-timeout", "0.5"])
    assert (a.max_n, a.allowed_origins, a.max_consecutive_step_failures) == (4, ["http://a", "http://b"], 5)
    assert a.trust_request_chat_template and a.disable_fastapi_docs and a.chat_template_timeout == 0.5
