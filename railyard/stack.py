"""The stack file: the one YAML a user writes to run railyard on Ray Serve (layer 2) and Kubernetes (layer 1).

`load_stack(path)` validates it once, at the edge; `to_serve_config(stack)` turns it into the standard
Ray Serve config that `serve run` takes and that a KubeRay RayService embeds unchanged as serveConfigV2.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from railyard.errors import ConfigError
from railyard.model.chat_format import ReasoningParserName, ToolCallParserName
from railyard.model.precision import Fp8Gemm, check_kv_cache_dtype, check_quantization

SERVE_IMPORT_PATH = "railyard.serve.app:build_app"
# Ray Serve's switch from its Python proxy to HAProxy (ray.serve._private.constants), read from the environment.
HAPROXY_ENV = "RAY_SERVE_ENABLE_HA_PROXY"

# The engine's own defaults (EngineConfig's) of the options the planner and the rendered deployments predict with:
# the serve config carries only the options a stack sets, so a replica starts with EngineConfig's defaults
# themselves, as `railyard serve` does (tests/test_stack_defaults.py holds the two equal). max_model_len None: the
# model's max_position_embeddings; dtype auto: the checkpoint's; max_num_batched_tokens None:
# max(BATCHED_TOKENS_FLOOR, max_num_seqs), with chunked prefill.
ENGINE_DEFAULTS: dict[str, Any] = {
    "max_num_seqs": 256,
    "max_num_batched_tokens": None,
    "block_size": 16,
    "max_model_len": None,
    "gpu_memory_utilization": 0.9,
    "dtype": "auto",
    "kv_cache_dtype": "auto",
    "quantization": None,
    "enforce_eager": False,
    "piecewise_cuda_graphs": True,
    # LoRA adapters (EngineConfig's defaults): a model's `lora` turns enable_lora on; the planner counts the slots
    "enable_lora": False,
    "max_loras": 1,
    "max_lora_rank": 16,
}
BATCHED_TOKENS_FLOOR = 8192

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Kubernetes resource.Quantity, as the API server's OpenAPI pattern spells it.
_QUANTITY = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


def _dns_label(value: str, what: str, max_len: int) -> str:
    if len(value) > max_len or not _DNS_LABEL.match(value):
        raise ValueError(
            f"{what} {value!r} must be a DNS-1123 label: lowercase letters, digits and '-', "
            f"starting and ending with a letter or digit, at most {max_len} characters"
        )
    return value


def _cores(quantity: str) -> float | None:
    """A cpu quantity in cores ('8', '500m'); None for the rarer forms the API server also accepts."""
    try:
        return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)
    except ValueError:
        return None


def _engine_check(check, value):
    """The engine's own check of a precision option (model/precision.py), as a pydantic error."""
    try:
        return check(value)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EngineOptions(_Strict):
    """Engine options a model or pool sets (EngineConfig's fields); a pool's unset ones fall back to the model's,
    and what neither sets is the engine's own default (ENGINE_DEFAULTS lists the ones the planner uses)."""

    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    block_size: int | None = Field(None, ge=1)
    max_model_len: int | None = Field(None, ge=1)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    dtype: Literal["bfloat16", "float16", "float32"] | None = None
    # "fp8": FP8 linear weights (an FP8 checkpoint is FP8 without it); "fp8" KV cache: twice the blocks of bf16.
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    # Which FP8 tensor-core GEMM (railyard serve's --fp8-gemm); unset: auto, the measured best.
    fp8_gemm: Fp8Gemm | None = None
    enable_prefix_caching: bool | None = None
    # The KV pool in blocks instead of the profiled share of gpu_memory_utilization: replicas sharing a GPU
    # (gpu_fraction < 1) need it, since each engine's profile counts the other's memory as used.
    num_gpu_blocks: int | None = Field(None, ge=1)
    # Latency knobs of the engine's scheduler (railyard serve's flags of the same names): a pool serving
    # streams that must tick evenly caps the prompt tokens a step carries beside decodes.
    long_prefill_token_threshold: int | None = Field(None, ge=0)
    max_prefill_tokens_with_decodes: int | None = Field(None, ge=0)
    # CUDA graphs (both kinds off with enforce_eager; the piecewise ones alone with piecewise_cuda_graphs):
    # the planner sizes the KV cache with or without their memory as the engine will.
    enforce_eager: bool | None = None
    piecewise_cuda_graphs: bool | None = None
    # torch's intra-op threads per engine (unset: every core but one on the CPU): CPU replicas sharing few cores
    # take 1 each.
    torch_threads: int | None = Field(None, ge=1)
    # LoRA adapters (vLLM's names; a model's `lora` turns enable_lora on): adapters mixed in one step (each a
    # device slot the planner counts), the widest rank, adapters kept in host memory.
    enable_lora: bool | None = None
    max_loras: int | None = Field(None, ge=1)
    max_lora_rank: int | None = Field(None, ge=1, le=64)
    max_cpu_loras: int | None = Field(None, ge=1)
    # How the chat endpoint reads the model's reasoning and tool calls (railyard serve's flags; unset: auto, by
    # the chat template).
    reasoning_parser: ReasoningParserName | None = None
    tool_call_parser: ToolCallParserName | None = None

    @field_validator("quantization")
    @classmethod
    def _quantization(cls, value: str | None) -> str | None:
        return _engine_check(check_quantization, value)

    @field_validator("kv_cache_dtype")
    @classmethod
    def _kv_cache_dtype(cls, value: str | None) -> str | None:
        return None if value is None else _engine_check(check_kv_cache_dtype, value)

    def set_options(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class Autoscaling(_Strict):
    """Replica autoscaling on pending work per replica (not GPU utilisation: it dips between steps).
    Each field's description is its reason, written next to it in the rendered serveConfigV2. The defaults are the
    serve layer's whether a stack file or plain Ray Serve args set the rest."""

    min_replicas: int = Field(1, ge=0, description="the floor; 0 scales to zero when idle, and the first request "
                              "then waits for a replica's cold start (it waits, it does not fail)")
    max_replicas: int = Field(..., ge=1)
    initial_replicas: int | None = Field(None, ge=0, description="replicas at deploy time (unset: min_replicas)")
    target_pending_per_replica: float = Field(
        8.0, gt=0, description="pending requests (running + waiting in the engine, + queued at handles) one "
        "replica should carry; more adds replicas (railyard's policy reads the engines' own counts)")
    upscale_delay_s: float = Field(
        3.0, ge=0, description="pending work must stay over the target this long before a replica is added: 3 s, "
        "not Ray's generic 30, because a new engine replica itself takes seconds to start and the signal is the "
        "engines' own queue, not a noisy utilisation; a burst gets its replica while it lasts, one report's spike "
        "does not buy a GPU")
    downscale_delay_s: float = Field(
        600.0, ge=0, description="load must stay low this long before a replica goes (Ray's default): bringing one "
        "back costs a cold start (weights, KV profiling, CUDA graphs), so lulls between bursts keep it")
    look_back_period_s: float = Field(
        5.0, gt=0, description="the window pending counts are averaged over, which a fall in load must last "
        "before it counts (a rise counts from the latest report): 5 s, not Ray's 30")
    metrics_interval_s: float = Field(
        1.0, gt=0, description="how often replicas and handles report their counts (Ray's default: 10 s); the "
        "policy cannot react faster than this")
    standby_engines: int | None = Field(
        None, ge=0, le=4, description="engines kept started and asleep per node and GPU (engine sleep mode: no KV "
        "cache, weights in host memory), so a replica added for a burst wakes one instead of starting an engine "
        "process (imports, weights, CUDA graphs); unset: 1 where replicas share a GPU (gpu_fraction below 1) and "
        "may scale up (max_replicas above min_replicas), else 0. A standby only ever takes a GPU share a replica of "
        "its own deployment could have used, so with whole-GPU replicas it has none; each holds a CUDA context and "
        "host memory the size of its weights (serve/standby.py)")

    @model_validator(mode="after")
    def _bounds(self) -> "Autoscaling":
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) must be >= min_replicas ({self.min_replicas})")
        if self.initial_replicas is not None and not self.min_replicas <= self.initial_replicas <= self.max_replicas:
            raise ValueError(f"initial_replicas ({self.initial_replicas}) must lie in [min_replicas, max_replicas]")
        if self.look_back_period_s <= self.metrics_interval_s:
            raise ValueError("look_back_period_s must be longer than metrics_interval_s: the average needs more "
                             "than one report")
        return self


class Lifecycle(_Strict):
    """How Ray Serve checks and stops an engine replica (options of its deployment), with a stack file or without.
    Each field's description is its reason, written next to it in the rendered serveConfigV2."""

    health_check_period_s: float = Field(
        5.0, gt=0, description="how often Serve asks the replica whether its engine loop is alive: a dead engine is "
        "replaced within this period plus the timeout, instead of failing every request routed to it")
    health_check_timeout_s: float = Field(
        30.0, gt=0, description="the check answers from the replica's event loop, not the step loop, so a slow "
        "answer means a starved process: wait this long before declaring it dead, not one long prefill")
    graceful_shutdown_timeout_s: float = Field(
        300.0, ge=0, description="scale-down and upgrades drain a replica: its in-flight generations get this long "
        "to finish (the longest generation at decode speed) before they are cut")
    graceful_shutdown_wait_loop_s: float = Field(
        0.5, gt=0, description="how often a draining replica checks whether it is empty: it leaves as soon as it is")


class Resources(_Strict):
    """CPU and memory each replica's pod reserves, and the size of its /dev/shm (NCCL needs a big one)."""

    cpu: str = "8"
    memory: str = "64Gi"
    shm: str = "8Gi"

    @field_validator("cpu", "memory", "shm", mode="before")
    @classmethod
    def _quantity(cls, value: Any) -> str:
        text = str(value)
        if not _QUANTITY.match(text):
            raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. '8', '500m', '64Gi')")
        return text


# -- LoRA adapters: which a model serves and where their directories come from in its pods ---------------------
DEFAULT_LORA_MOUNT_PATH = "/lora-adapters"


class AdapterSource(_Strict):
    """Where the adapter directories come from, mounted read-only at mount_path: exactly one of a
    PersistentVolumeClaim, a node's hostPath directory, or an image whose image_path an init container copies
    into an emptyDir (nothing is fetched from a URL at start; the image needs `cp`)."""

    persistent_volume_claim: str | None = Field(
        None, description="the claim's name; pods of several nodes share it only if its access mode is "
        "ReadOnlyMany or ReadWriteMany")
    host_path: str | None = Field(None, description="a directory present on every node the model's pods run on")
    image: str | None = Field(None, description="an image holding the adapters under image_path, copied by an "
                              "init container into an emptyDir each pod starts with")
    image_path: str = "/adapters"
    mount_path: str = DEFAULT_LORA_MOUNT_PATH
    size_limit: str | None = Field(None, description="the emptyDir's sizeLimit (image source only), e.g. 2Gi")

    @field_validator("host_path", "image_path", "mount_path")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"{value!r} must be an absolute path")
        return value

    @field_validator("size_limit")
    @classmethod
    def _quantity(cls, value: str | None) -> str | None:
        if value is not None and not _QUANTITY.match(value):
            raise ValueError(f"size_limit {value!r} is not a Kubernetes quantity (e.g. 2Gi)")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> AdapterSource:
        given = [k for k in ("persistent_volume_claim", "host_path", "image") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError("an adapter source is exactly one of persistent_volume_claim, host_path or image, "
                             f"got {', '.join(given) or 'none'}")
        if self.size_limit is not None and self.image is None:
            raise ValueError("size_limit sizes the emptyDir an image source is copied into; a volume has its own")
        return self


class StackAdapter(_Strict):
    """One adapter: the name requests give as `model`, and its PEFT directory (relative to the source's mount)."""

    name: str = Field(..., min_length=1)
    path: str = Field(..., min_length=1)


class ModelLoRA(_Strict):
    """The LoRA adapters a model serves from the start, and where they come from; engine.max_loras,
    max_lora_rank and max_cpu_loras size them (the planner counts their device memory)."""

    adapters: list[StackAdapter] = Field(default_factory=list)
    source: AdapterSource | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ModelLoRA:
        names = [a.name for a in self.adapters]
        if len(set(names)) != len(names):
            raise ValueError(f"adapter names must be unique, got {names}")
        relative = [a.name for a in self.adapters if not a.path.startswith("/")]
        if relative and self.source is None:
            raise ValueError(f"adapters {', '.join(relative)} have relative paths: give a source (a volume or an "
                             "image) they are relative to")
        return self

    def pod_paths(self) -> dict[str, str]:
        """Each adapter's directory inside a pod: relative paths under the source's mount path."""
        root = self.source.mount_path if self.source is not None else "/"
        return {a.name: posixpath.normpath(posixpath.join(root, a.path)) for a in self.adapters}


class StackPool(_Strict):
    """A length pool of a stack's model: prompts up to max_prompt_tokens go here; a pool without a limit takes the
    rest (the serve layer deploys each as a serve.spec.PoolDeployment)."""

    name: str
    max_prompt_tokens: int | None = Field(None, ge=1)
    engine: EngineOptions = EngineOptions()
    num_replicas: int | None = Field(None, ge=0)
    autoscaling: Autoscaling | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _dns_label(value, "pool name", 20)


class StackModel(_Strict):
    """One model of a stack: where its checkpoint is, how many GPUs a replica takes, how many replicas (the serve
    layer deploys it as a serve.spec.ServedModel; model.spec.ModelSpec is its architecture)."""

    name: str
    model: str
    tensor_parallel_size: int = Field(1, ge=1)
    num_replicas: int = Field(1, ge=0)
    autoscaling: Autoscaling | None = None
    lifecycle: Lifecycle = Lifecycle()
    engine: EngineOptions = EngineOptions()
    pools: list[StackPool] = []
    resources: Resources = Resources()
    gpu_product: str | None = None
    shape: str | None = None  # named model shape for sizing when the checkpoint is not on this machine
    lora: ModelLoRA | None = Field(
        None, description="LoRA adapters served beside the model (a request's model names one) and where their "
        "directories come from; turns on the engine's enable_lora")
    gpu_fraction: float = Field(
        1.0, gt=0, le=1, description="the share of one GPU each replica asks Ray for: below 1 (e.g. 0.5) several "
        "replicas of a small model share a GPU; tensor_parallel_size 1 only, and engine.num_gpu_blocks sizes each "
        "one's KV cache. Rendered pods still hold whole GPUs")
    gpu_sharing: Literal["mps", "time-slicing"] = Field(
        "mps", description="how replicas that share a GPU (gpu_fraction below 1) share it: mps starts a CUDA MPS "
        "control daemon before Ray (in each worker pod; `railyard cluster up` on a Ray of its own starts one too), "
        "so their kernels run at the same time (docs/architecture.md has what it buys); time-slicing leaves "
        "the GPU to take turns between them. Without the daemon's binary (nvidia-container-toolkit mounts it into "
        "containers with the compute capability) a line is logged and the replicas time-slice")
    stream_interval_s: float = Field(
        0.05, ge=0, description="a replica sends a stream's first tokens at once, then what was generated at most "
        "once per this interval, and the end at once: each Ray stream item costs the replica, ingress and proxy "
        "CPU, so one item per token caps the Ray path far below the engine (ray #52745). 0.05 s is Ray Serve LLM's "
        "stream batching interval: a reader sees tokens in small bursts, TTFT and the end are not delayed (0: one "
        "item per engine step)")
    stream_items_per_s: float = Field(
        500.0, ge=0, description="with many streams a replica's interval grows to live streams / this budget, so it "
        "sends about this many Ray items per second in all, whatever the number of streams: more tokens per item "
        "instead of more items than the ingress and the proxy relay. 500 keeps 0.05 s up to 25 streams a replica "
        "(0: the fixed stream_interval_s only)")

    @property
    def mps_shared(self) -> bool:
        """Whether replicas of this model share a GPU under a CUDA MPS daemon (rendered pods and `cluster up`)."""
        return self.gpu_fraction < 1 and self.gpu_sharing == "mps"

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _dns_label(value, "model name", 30)

    @model_validator(mode="after")
    def _consistent(self) -> "StackModel":
        if self.autoscaling is not None and "num_replicas" in self.model_fields_set:
            raise ValueError("set either num_replicas or autoscaling, not both")
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pool names must be unique, got {names}")
        for i, pool in enumerate(self.pools):
            last = i == len(self.pools) - 1
            if pool.max_prompt_tokens is None and not last:
                raise ValueError(f"pool {pool.name!r} has no max_prompt_tokens; only the last pool may omit it")
            if pool.max_prompt_tokens is not None and last and len(self.pools) > 1:
                raise ValueError(f"the last pool {pool.name!r} must omit max_prompt_tokens to take the longest prompts")
        cpus = _cores(self.resources.cpu)
        if cpus is not None and cpus < self.tensor_parallel_size:
            raise ValueError(
                f"resources.cpu ({self.resources.cpu}) must be at least tensor_parallel_size "
                f"({self.tensor_parallel_size}): each STRICT_PACK bundle of a replica takes one CPU"
            )
        if self.gpu_fraction < 1:
            if self.tensor_parallel_size > 1:
                raise ValueError("gpu_fraction below 1 needs tensor_parallel_size 1: each rank takes a whole GPU")
            unsized = [p.name for p in self.pools if (p.engine.num_gpu_blocks or self.engine.num_gpu_blocks) is None]
            if (not self.pools and self.engine.num_gpu_blocks is None) or unsized:
                raise ValueError(
                    "gpu_fraction below 1 needs engine.num_gpu_blocks (each replica's KV cache in blocks): replicas "
                    "sharing a GPU start together, and each engine's memory profile would count the others' memory"
                    + (f" (pools without it: {', '.join(unsized)})" if unsized else ""))
        limits = [p.max_prompt_tokens for p in self.pools if p.max_prompt_tokens is not None]
        if limits != sorted(set(limits)):
            raise ValueError(f"pool max_prompt_tokens must increase strictly, got {limits}")
        return self


class Ingress(_Strict):
    """The OpenAI ingress deployment of the Ray Serve app (the FastAPI front every stream passes through)."""

    num_replicas: int = Field(
        1, ge=1, description="ingress replicas (num_cpus 0 each) the HTTP proxy spreads requests over: every token of "
        "every stream crosses the ingress twice (in from an engine replica, out to the proxy) and Ray's per-item "
        "streaming cost (ray #52746) can saturate one ingress process at a few hundred streams; with more than one, "
        "the front's /metrics read through the proxy shows one ingress at a time")
    proxy: Literal["haproxy", "ray"] = Field(
        "haproxy", description="Ray Serve's HTTP proxy, a setting of every Ray process's environment "
        f"({HAPROXY_ENV}): haproxy runs a C HAProxy per node that forwards HTTP to the ingress replicas, which "
        "serve it themselves; ray is Serve's Python ProxyActor, one event loop per node that every request and "
        "stream item crosses (ray #52746). haproxy is the default: a fraction of the Python proxy's CPU, lower "
        "TTFT, and the fleet as fast as one direct `railyard serve` (BENCHMARKS.md, serve layer)")

    lora_runtime_updates: bool = Field(
        False, description="POST /v1/load_lora_adapter and /v1/unload_lora_adapter may change the adapters while "
        "serving (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING; behind the API key where one is set)")

    def ray_env(self) -> dict[str, str]:
        """The environment every Ray process of the stack's cluster needs for its proxy (Serve reads it at import)."""
        return {HAPROXY_ENV: "1" if self.proxy == "haproxy" else "0"}


class KernelCache(_Strict):
    """Where each engine replica keeps railyard's kernel cache ($RAILYARD_CACHE: Triton's compiled kernels, the
    tokenizers): a replica that finds its kernels there loads them instead of compiling them, seconds sooner
    (README, kernel cache). Each field's description is its reason, written next to it on the rendered pods."""

    mode: Literal["pod", "node", "image"] = Field(
        "pod", description="pod: an emptyDir of the replica's own (works everywhere; every new pod starts cold); "
        "node: a directory on the node (hostPath) shared by every replica that lands there, so only a node's first "
        "start compiles (the directory must be writable by the pods' uid 1000, and the cluster must allow hostPath "
        "volumes); image: the cache is in the image at `path`, filled at build time by `railyard cache fill "
        "--config` on the stack's GPU product (every pod starts warm; an image per GPU product and driver stack)")
    path: str = Field("/var/cache/railyard", min_length=1, description="the cache's directory in the container "
                      "($RAILYARD_CACHE)")
    host_path: str = Field("/var/cache/railyard", min_length=1, description="node mode: the directory on the node")
    size_limit: str = Field("4Gi", description="pod mode: the emptyDir's size limit (a stack's kernels take tens "
                            "of MB; tokenizers a few more)")

    @field_validator("path", "host_path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"{value!r} must be an absolute path")
        return value

    @field_validator("size_limit", mode="before")
    @classmethod
    def _quantity(cls, value: Any) -> str:
        return Resources._quantity(value)


class Policies(_Strict):
    """Production policies for rendered manifests: all on by default except the VPA, each switchable."""

    gpu_limits: bool = True
    gpu_toleration: bool = True
    gpu_node_affinity: bool = True
    spread: Literal["off", "preferred", "required"] = "preferred"
    probes: bool = True
    pdb: bool = True
    resources: bool = True
    shm: bool = True
    security_context: bool = True
    prometheus: bool = True
    vpa: bool = False

    @field_validator("spread", mode="before")
    @classmethod
    def _spread_bool(cls, value: Any) -> Any:
        # `spread: true` reads naturally in YAML; it means the soft (preferred) spread.
        if value is True:
            return "preferred"
        if value is False:
            return "off"
        return value


class Stack(_Strict):
    """The whole stack: naming, image, target GPU product and Kubernetes version, models, policies."""

    name: str = "railyard"
    namespace: str = "default"
    image: str = Field(..., min_length=1)
    gpu_product: str | None = None
    kubernetes_version: str = "1.30"
    ray_version: str = "2.60.0"  # the serve layer uses the request-router and autoscaling-policy APIs of 2.60
    mode: Literal["rayservice", "deployment"] = "rayservice"
    models: list[StackModel] = Field(..., min_length=1)
    ingress: Ingress = Ingress()
    policies: Policies = Policies()
    kernel_cache: KernelCache = KernelCache()

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _dns_label(value, "stack name", 30)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        return _dns_label(value, "namespace", 63)

    @field_validator("kubernetes_version", mode="before")
    @classmethod
    def _version(cls, value: Any) -> str:
        text = str(value).removeprefix("v")
        if not re.match(r"^1\.\d+$", text):
            raise ValueError(f"kubernetes_version {value!r} must look like '1.30'")
        return text

    @model_validator(mode="after")
    def _unique_models(self) -> "Stack":
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}")
        return self


def load_stack(path: str | Path) -> Stack:
    """Read and validate a stack YAML file; any problem is one ConfigError naming the field."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"stack file {path} not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"stack file {path} is not valid YAML: {exc}") from None
    return parse_stack(data, source=str(path))


def parse_stack(data: Any, source: str = "stack") -> Stack:
    """Validate an already-parsed stack mapping."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping with 'image' and 'models'")
    try:
        return Stack.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ConfigError(f"{source}: {where}: {err['msg']}{more}") from None


def deployment_name(model: str, pool: str | None) -> str:
    """The Ray Serve deployment (and KubeRay worker group) name of one model's pool."""
    return f"engine-{model}-{pool or 'default'}"


def engine_options(model: StackModel, pool: StackPool | None = None) -> dict[str, Any]:
    """The engine options a stack sets for one deployment: the model's own, then the pool's, and its
    tensor_parallel_size; the engine's defaults are for the engine to apply."""
    options = model.engine.set_options()
    if pool is not None:
        options.update(pool.engine.set_options())
    options["tensor_parallel_size"] = model.tensor_parallel_size
    if model.lora is not None:
        options["enable_lora"] = True
    return options


def resolved_engine(model: StackModel, pool: StackPool | None = None) -> dict[str, Any]:
    """engine_options over ENGINE_DEFAULTS: what the planner and the rendered deployment options predict with."""
    return {**ENGINE_DEFAULTS, **engine_options(model, pool)}


def replica_pools(model: StackModel) -> list[tuple[str, StackPool | None]]:
    """(deployment name, pool) for each deployment a model needs: one per pool, or one 'default'."""
    if not model.pools:
        return [(deployment_name(model.name, None), None)]
    return [(deployment_name(model.name, p.name), p) for p in model.pools]


def standby_engines(auto: Autoscaling | None, gpus_per_replica: float) -> int:
    """The standby engines a deployment keeps per node and GPU: autoscaling.standby_engines where set, else one
    where its replicas share a GPU and may scale up (a burst's replica then wakes an engine instead of starting
    one, on a share of the GPU that replica would have taken anyway), else none."""
    if auto is None:
        return 0
    if auto.standby_engines is not None:
        return auto.standby_engines
    return int(0 < gpus_per_replica < 1 and auto.max_replicas > auto.min_replicas)


def scaling(model: StackModel, pool: StackPool | None) -> tuple[int, Autoscaling | None]:
    """(fixed replica count, autoscaling) for one deployment; a pool's own setting wins."""
    if pool is not None and (pool.autoscaling is not None or pool.num_replicas is not None):
        return (pool.num_replicas or 0, pool.autoscaling)
    return (model.num_replicas, model.autoscaling)


def _model_args(model: StackModel) -> dict[str, Any]:
    pools = []
    for name, pool in replica_pools(model):
        pools.append(
            {
                "name": pool.name if pool else "default",
                "max_prompt_tokens": pool.max_prompt_tokens if pool else None,
                "deployment": name,
                "engine": engine_options(model, pool),
                **_standby_args(model, pool),
            }
        )
    args: dict[str, Any] = {
        "name": model.name,
        "model": model.model,
        "tensor_parallel_size": model.tensor_parallel_size,
        "engine": engine_options(model),
        "pools": pools,
        "stream_interval_s": model.stream_interval_s,
        "stream_items_per_s": model.stream_items_per_s,
    }
    if model.lora is not None:
        args["lora"] = {"adapters": [{"name": n, "path": p} for n, p in model.lora.pod_paths().items()]}
    return args


def _standby_args(model: StackModel, pool: StackPool | None) -> dict[str, Any]:
    """What a pool's replicas need of its autoscaling: the standby engines to keep and the replicas their GPU may
    hold at most. Only that: Ray Serve hashes `args` into the app's code version, so an autoscaling bound or delay
    in args would restart every replica when edited; in `deployments` it is an update in place."""
    _, auto = scaling(model, pool)
    engines = standby_engines(auto, model.gpu_fraction)
    if auto is None or not engines:
        return {}
    return {"standby": {"engines": engines, "max_replicas": auto.max_replicas}}


def _deployment(model: StackModel, name: str, pool: StackPool | None) -> dict[str, Any]:
    engine = resolved_engine(model, pool)
    entry: dict[str, Any] = {"name": name}
    replicas, auto = scaling(model, pool)
    if auto is not None:
        entry["autoscaling_config"] = {
            "min_replicas": auto.min_replicas,
            "max_replicas": auto.max_replicas,
            # Ray counts queued + running requests as "ongoing"; that is our pending work per replica.
            "target_ongoing_requests": auto.target_pending_per_replica,
            **auto.model_dump(include={"initial_replicas", "upscale_delay_s", "downscale_delay_s",
                                       "look_back_period_s", "metrics_interval_s"}, exclude_none=True),
            # railyard's policy: replicas from the engines' own pending counts (a config file's
            # autoscaling_config replaces the one set in code, so the policy must be named here).
            "policy": {"policy_function": "railyard.serve.autoscaling:pending_requests_policy"},
        }
    else:
        entry["num_replicas"] = replicas
    # Ray's default of 5 would starve continuous batching; admit as many as the engine can run.
    entry["max_ongoing_requests"] = engine["max_num_seqs"]
    entry.update(model.lifecycle.model_dump())
    tp = model.tensor_parallel_size
    # The replica actor is rank 0; with TP it sits in bundle 0 and ranks 1..tp-1 take the other bundles.
    entry["ray_actor_options"] = {"num_cpus": 1, "num_gpus": model.gpu_fraction if tp == 1 else 1}
    if tp > 1:
        entry["placement_group_bundles"] = [{"GPU": 1, "CPU": 1} for _ in range(tp)]
        entry["placement_group_strategy"] = "STRICT_PACK"
    return entry


def to_serve_config(stack: Stack) -> dict[str, Any]:
    """The Ray Serve config (`serve run` / serveConfigV2) for a stack.

    `args` is what `railyard.serve.app:build_app(args)` receives:
    `{"models": [{"name", "model", "tensor_parallel_size", "engine": {...}, "stream_interval_s", "stream_items_per_s",
    "pools": [{"name", "max_prompt_tokens" (None = no limit), "deployment", "engine": {...},
    "standby"?: {"engines", "max_replicas"}}]}], "ingress": {...}}`
    (the ingress's proxy is not among them: it is the Ray cluster's environment, `Ingress.ray_env()`),
    where each pool's `deployment` names its entry in `deployments` and `engine` holds the options the stack sets
    for it (the model's, then the pool's): the engine applies its own defaults to the rest. Replica counts and
    autoscaling live in `deployments` only, where Ray Serve applies an edit to the running replicas; what is in
    `args` is code to Ray Serve, and an edit there starts every replica anew.
    """
    deployments = [_deployment(model, name, pool) for model in stack.models for name, pool in replica_pools(model)]
    app = {
        "name": stack.name,
        "route_prefix": "/",
        "import_path": SERVE_IMPORT_PATH,
        "args": {"models": [_model_args(m) for m in stack.models],
                 "ingress": stack.ingress.model_dump(exclude={"proxy"} if stack.ingress.lora_runtime_updates
                                                     else {"proxy", "lora_runtime_updates"})},
        "deployments": deployments,
    }
    return {"applications": [app]}
