"""The target: the server's protocol, address and what its requests carry."""

from __future__ import annotations

from dataclasses import dataclass

from records.checks import name_value, url_path, within
from records.declare import Names, Settings, require, setting
from records.expert_routes import moe_shape_problem
from records.load_settings.choices import (
    OPENAI,
    TRITON,
)


@dataclass(frozen=True)
class TargetSettings(Settings):
    """Target"""

    target: str = setting("moe", "the server's protocol (docs/targets.md)",
                          choices=Names("targets"),
                          label="Server protocol")
    endpoint: str = setting("/v1/completions", "openai: /v1/completions or /v1/chat/completions",
                            check=url_path, compared=False,
                            label="OpenAI endpoint path", when=OPENAI)
    model: str = setting("", "openai: the model to ask for (default: the first /v1/models "
                         "lists); triton: the model to call", compared=False,
                         label="Model name", when={"target": ("openai", "triton")})
    api_key: str = setting("", "openai: sent as a bearer token (default: $OPENAI_API_KEY)",
                           compared=False, secret=True,
                           label="OpenAI API key", when=OPENAI)
    headers: tuple[str, ...] = setting((), "openai: an extra HTTP header NAME:VALUE",
                                       flag="header", check=name_value, compared=False, secret=True,
                                       label="Extra HTTP header (NAME:VALUE)", when=OPENAI)
    exact_length: bool = setting(True, "openai: ask for exactly --max-tokens output tokens with "
                                 "ignore_eos and min_tokens (vLLM, SGLang and this project's "
                                 "server take them); --no-exact-length for servers that refuse "
                                 "fields they do not know",
                                 label="Ask for exactly the output tokens", when=OPENAI)
    token_ids: bool | None = setting(None, "openai: ask for each chunk's token ids "
                                     "(return_token_ids: vLLM 0.10.2+ and this project's "
                                     "server), so output tokens are counted exactly without "
                                     "--tokenizer; default: where /v1/models names either",
                                     compared=False, label="Ask for token ids", when=OPENAI)
    routed_experts: str = setting("off", "openai: the experts the server's router chose for each "
                                  "request, into routed_experts.jsonl (docs/targets.md). on: "
                                  "ask (SGLang's return_routed_experts; vLLM sends them when "
                                  "started with --enable-return-routed-experts) and warn where "
                                  "replies lack them; auto: ask where /v1/models names vLLM, "
                                  "SGLang or this project's servers",
                                  choices=("off", "on", "auto"), compared=False,
                                  label="Routed experts", when=OPENAI)
    routed_experts_sample: float = setting(
        0.1, "openai, with --routed-experts: the share of requests sent non-streamed, whose "
        "replies carry the routed experts where vLLM's and this project's do (streamed ones "
        "never do); their TTFT, TPOT and ITL are not measured. 1: every request",
        check=within(0, 1), label="Routed experts: share not streamed", when=OPENAI)
    moe_shape: str = setting("", "the model's LAYERSxEXPERTSxTOP_K (48x128x8): needed to read "
                             "SGLang's flat routed-expert ids; vLLM's layers, top-k and ids "
                             "are checked against it",
                             check=moe_shape_problem, compared=False,
                             label="MoE shape (layers x experts x top-k)", when=OPENAI)
    tokenizer: str = setting("", "a Hugging Face tokenizer.json that counts the output tokens of "
                             "targets that stream text (openai; triton's trtllm backend); "
                             "without it they are estimated and the run says how",
                             compared=False,
                             label="Tokenizer file (tokenizer.json)",
                             when={"target": ("openai", "triton")})
    triton_backend: str = setting("vllm", "triton: the model's request shape, vllm (the vLLM "
                                  "backend) or trtllm (TensorRT-LLM's ensemble or BLS model)",
                                  choices=("vllm", "trtllm"), compared=False,
                                  label="Triton backend", when=TRITON)
    triton_input: str = setting("text_input", "triton: the prompt's input tensor",
                                compared=False,
                                label="Triton input tensor", when=TRITON)
    triton_output: str = setting("text_output", "triton: the generated text's output tensor",
                                 compared=False,
                                 label="Triton output tensor", when=TRITON)
    tls: bool = setting(False, "connect over TLS, trusting the system's CAs unless --tls-ca "
                        "(implied by --tls-ca and --tls-client-cert; openai: an https:// "
                        "--host)",
                        compared=False,
                        label="TLS")
    tls_ca: str = setting("", "PEM CA bundle that signed the server's certificate",
                          compared=False,
                          label="TLS CA bundle (PEM)")
    # Locust's own --tls-cert/--tls-key serve its web UI over https
    tls_cert: str = setting("", "mutual TLS: this client's PEM certificate chain (with "
                            "--tls-client-key)", flag="tls-client-cert", compared=False,
                            label="TLS client certificate (PEM)")
    tls_key: str = setting("", "the PEM private key of --tls-client-cert",
                           flag="tls-client-key", compared=False,
                           label="TLS client key (PEM)")
    auth_token: str = setting("", "bearer token sent with every call (gRPC metadata "
                              "authorization, the HTTP Authorization header); default "
                              "$MOE_AUTH_TOKEN", compared=False, secret=True,
                              label="Bearer token")

    def __post_init__(self):
        super().__post_init__()
        require(bool(self.tls_cert) == bool(self.tls_key), "tls-client-key" if self.tls_cert
                else "tls-client-cert", "--tls-client-cert and --tls-client-key go together")
        require(self.routed_experts == "off" or self.target == "openai", "routed-experts",
                f"is for --target openai (vLLM's and SGLang's HTTP APIs, this project's "
                f"server's); {self.target}'s protocol carries no routed experts")
