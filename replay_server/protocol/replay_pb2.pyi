from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InstanceRef(_message.Message):
    __slots__ = ("record_db", "record_id", "verification", "measurement")
    RECORD_DB_FIELD_NUMBER: _ClassVar[int]
    RECORD_ID_FIELD_NUMBER: _ClassVar[int]
    VERIFICATION_FIELD_NUMBER: _ClassVar[int]
    MEASUREMENT_FIELD_NUMBER: _ClassVar[int]
    record_db: str
    record_id: str
    verification: Verification
    measurement: Measurement
    def __init__(self, record_db: _Optional[str] = ..., record_id: _Optional[str] = ..., verification: _Optional[_Union[Verification, _Mapping]] = ..., measurement: _Optional[_Union[Measurement, _Mapping]] = ...) -> None: ...

class Measurement(_message.Message):
    __slots__ = ("energy", "energy_window_seconds", "conditions_max_age_seconds")
    ENERGY_FIELD_NUMBER: _ClassVar[int]
    ENERGY_WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_MAX_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    energy: bool
    energy_window_seconds: float
    conditions_max_age_seconds: float
    def __init__(self, energy: _Optional[bool] = ..., energy_window_seconds: _Optional[float] = ..., conditions_max_age_seconds: _Optional[float] = ...) -> None: ...

class Verification(_message.Message):
    __slots__ = ("mode", "runs", "safety", "overrides", "derived", "relocate", "every_iteration")
    MODE_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    SAFETY_FIELD_NUMBER: _ClassVar[int]
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    DERIVED_FIELD_NUMBER: _ClassVar[int]
    RELOCATE_FIELD_NUMBER: _ClassVar[int]
    EVERY_ITERATION_FIELD_NUMBER: _ClassVar[int]
    mode: str
    runs: int
    safety: float
    overrides: str
    derived: str
    relocate: bool
    every_iteration: bool
    def __init__(self, mode: _Optional[str] = ..., runs: _Optional[int] = ..., safety: _Optional[float] = ..., overrides: _Optional[str] = ..., derived: _Optional[str] = ..., relocate: _Optional[bool] = ..., every_iteration: _Optional[bool] = ...) -> None: ...

class Dim3(_message.Message):
    __slots__ = ("x", "y", "z")
    X_FIELD_NUMBER: _ClassVar[int]
    Y_FIELD_NUMBER: _ClassVar[int]
    Z_FIELD_NUMBER: _ClassVar[int]
    x: int
    y: int
    z: int
    def __init__(self, x: _Optional[int] = ..., y: _Optional[int] = ..., z: _Optional[int] = ...) -> None: ...

class Configuration(_message.Message):
    __slots__ = ("grid", "block", "shared_mem", "specialize", "set_launch_bounds", "max_threads", "min_blocks_per_sm", "specialize_dims", "passes", "codegen_opt", "codegen_method", "prune", "internalize")
    GRID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEM_FIELD_NUMBER: _ClassVar[int]
    SPECIALIZE_FIELD_NUMBER: _ClassVar[int]
    SET_LAUNCH_BOUNDS_FIELD_NUMBER: _ClassVar[int]
    MAX_THREADS_FIELD_NUMBER: _ClassVar[int]
    MIN_BLOCKS_PER_SM_FIELD_NUMBER: _ClassVar[int]
    SPECIALIZE_DIMS_FIELD_NUMBER: _ClassVar[int]
    PASSES_FIELD_NUMBER: _ClassVar[int]
    CODEGEN_OPT_FIELD_NUMBER: _ClassVar[int]
    CODEGEN_METHOD_FIELD_NUMBER: _ClassVar[int]
    PRUNE_FIELD_NUMBER: _ClassVar[int]
    INTERNALIZE_FIELD_NUMBER: _ClassVar[int]
    grid: Dim3
    block: Dim3
    shared_mem: int
    specialize: bool
    set_launch_bounds: bool
    max_threads: int
    min_blocks_per_sm: int
    specialize_dims: bool
    passes: str
    codegen_opt: int
    codegen_method: str
    prune: bool
    internalize: bool
    def __init__(self, grid: _Optional[_Union[Dim3, _Mapping]] = ..., block: _Optional[_Union[Dim3, _Mapping]] = ..., shared_mem: _Optional[int] = ..., specialize: _Optional[bool] = ..., set_launch_bounds: _Optional[bool] = ..., max_threads: _Optional[int] = ..., min_blocks_per_sm: _Optional[int] = ..., specialize_dims: _Optional[bool] = ..., passes: _Optional[str] = ..., codegen_opt: _Optional[int] = ..., codegen_method: _Optional[str] = ..., prune: _Optional[bool] = ..., internalize: _Optional[bool] = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ("preprocess_ir_time", "opt_time", "codegen_time", "obj_size", "exec_time", "verified", "executed", "failed", "start_time", "end_time", "gpu_id", "const_mem_usage", "local_mem_usage", "reg_usage", "error", "status", "warmup", "shared_mem_usage", "compile_cached", "mismatches", "relocated", "verified_within", "nondeterminism", "relocation_reason", "reset_each_launch", "reset_reason", "metrics", "metrics_error", "energy_j", "power_w", "conditions")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    PREPROCESS_IR_TIME_FIELD_NUMBER: _ClassVar[int]
    OPT_TIME_FIELD_NUMBER: _ClassVar[int]
    CODEGEN_TIME_FIELD_NUMBER: _ClassVar[int]
    OBJ_SIZE_FIELD_NUMBER: _ClassVar[int]
    EXEC_TIME_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_FIELD_NUMBER: _ClassVar[int]
    EXECUTED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    GPU_ID_FIELD_NUMBER: _ClassVar[int]
    CONST_MEM_USAGE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_MEM_USAGE_FIELD_NUMBER: _ClassVar[int]
    REG_USAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    WARMUP_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEM_USAGE_FIELD_NUMBER: _ClassVar[int]
    COMPILE_CACHED_FIELD_NUMBER: _ClassVar[int]
    MISMATCHES_FIELD_NUMBER: _ClassVar[int]
    RELOCATED_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_WITHIN_FIELD_NUMBER: _ClassVar[int]
    NONDETERMINISM_FIELD_NUMBER: _ClassVar[int]
    RELOCATION_REASON_FIELD_NUMBER: _ClassVar[int]
    RESET_EACH_LAUNCH_FIELD_NUMBER: _ClassVar[int]
    RESET_REASON_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    METRICS_ERROR_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    preprocess_ir_time: float
    opt_time: float
    codegen_time: float
    obj_size: int
    exec_time: _containers.RepeatedScalarFieldContainer[int]
    verified: bool
    executed: bool
    failed: bool
    start_time: str
    end_time: str
    gpu_id: int
    const_mem_usage: int
    local_mem_usage: int
    reg_usage: int
    error: str
    status: str
    warmup: int
    shared_mem_usage: int
    compile_cached: bool
    mismatches: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    relocated: bool
    verified_within: _struct_pb2.Struct
    nondeterminism: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    relocation_reason: str
    reset_each_launch: bool
    reset_reason: str
    metrics: _containers.ScalarMap[str, float]
    metrics_error: str
    energy_j: float
    power_w: float
    conditions: Conditions
    def __init__(self, preprocess_ir_time: _Optional[float] = ..., opt_time: _Optional[float] = ..., codegen_time: _Optional[float] = ..., obj_size: _Optional[int] = ..., exec_time: _Optional[_Iterable[int]] = ..., verified: _Optional[bool] = ..., executed: _Optional[bool] = ..., failed: _Optional[bool] = ..., start_time: _Optional[str] = ..., end_time: _Optional[str] = ..., gpu_id: _Optional[int] = ..., const_mem_usage: _Optional[int] = ..., local_mem_usage: _Optional[int] = ..., reg_usage: _Optional[int] = ..., error: _Optional[str] = ..., status: _Optional[str] = ..., warmup: _Optional[int] = ..., shared_mem_usage: _Optional[int] = ..., compile_cached: _Optional[bool] = ..., mismatches: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., relocated: _Optional[bool] = ..., verified_within: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., nondeterminism: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., relocation_reason: _Optional[str] = ..., reset_each_launch: _Optional[bool] = ..., reset_reason: _Optional[str] = ..., metrics: _Optional[_Mapping[str, float]] = ..., metrics_error: _Optional[str] = ..., energy_j: _Optional[float] = ..., power_w: _Optional[float] = ..., conditions: _Optional[_Union[Conditions, _Mapping]] = ...) -> None: ...

class Conditions(_message.Message):
    __slots__ = ("before", "after", "throttled", "throttle_reasons", "unavailable", "energy")
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_REASONS_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    ENERGY_FIELD_NUMBER: _ClassVar[int]
    before: GpuReading
    after: GpuReading
    throttled: bool
    throttle_reasons: _containers.RepeatedScalarFieldContainer[str]
    unavailable: str
    energy: EnergyWindow
    def __init__(self, before: _Optional[_Union[GpuReading, _Mapping]] = ..., after: _Optional[_Union[GpuReading, _Mapping]] = ..., throttled: _Optional[bool] = ..., throttle_reasons: _Optional[_Iterable[str]] = ..., unavailable: _Optional[str] = ..., energy: _Optional[_Union[EnergyWindow, _Mapping]] = ...) -> None: ...

class GpuReading(_message.Message):
    __slots__ = ("sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w", "clock_event_reasons", "age_seconds")
    SM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    MEM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    CLOCK_EVENT_REASONS_FIELD_NUMBER: _ClassVar[int]
    AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    sm_clock_mhz: int
    mem_clock_mhz: int
    temperature_c: int
    power_w: float
    clock_event_reasons: _containers.RepeatedScalarFieldContainer[str]
    age_seconds: float
    def __init__(self, sm_clock_mhz: _Optional[int] = ..., mem_clock_mhz: _Optional[int] = ..., temperature_c: _Optional[int] = ..., power_w: _Optional[float] = ..., clock_event_reasons: _Optional[_Iterable[str]] = ..., age_seconds: _Optional[float] = ...) -> None: ...

class EnergyWindow(_message.Message):
    __slots__ = ("window_seconds", "launches", "counter_steps", "batches", "launches_run", "error")
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LAUNCHES_FIELD_NUMBER: _ClassVar[int]
    COUNTER_STEPS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    LAUNCHES_RUN_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    window_seconds: float
    launches: float
    counter_steps: int
    batches: int
    launches_run: int
    error: str
    def __init__(self, window_seconds: _Optional[float] = ..., launches: _Optional[float] = ..., counter_steps: _Optional[int] = ..., batches: _Optional[int] = ..., launches_run: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class ReplayRequest(_message.Message):
    __slots__ = ("request_id", "instance", "config", "iterations", "warmup", "timeout_seconds", "metrics")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    WARMUP_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    instance: InstanceRef
    config: Configuration
    iterations: int
    warmup: int
    timeout_seconds: float
    metrics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_id: _Optional[str] = ..., instance: _Optional[_Union[InstanceRef, _Mapping]] = ..., config: _Optional[_Union[Configuration, _Mapping]] = ..., iterations: _Optional[int] = ..., warmup: _Optional[int] = ..., timeout_seconds: _Optional[float] = ..., metrics: _Optional[_Iterable[str]] = ...) -> None: ...

class ReplayBatch(_message.Message):
    __slots__ = ("requests", "hold_responses_seconds")
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    HOLD_RESPONSES_SECONDS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[ReplayRequest]
    hold_responses_seconds: float
    def __init__(self, requests: _Optional[_Iterable[_Union[ReplayRequest, _Mapping]]] = ..., hold_responses_seconds: _Optional[float] = ...) -> None: ...

class ReplayResponseBatch(_message.Message):
    __slots__ = ("responses",)
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[ReplayResponse]
    def __init__(self, responses: _Optional[_Iterable[_Union[ReplayResponse, _Mapping]]] = ...) -> None: ...

class ReplayResponse(_message.Message):
    __slots__ = ("request_id", "result", "worker", "queued_seconds", "server_seconds", "error_code", "error_message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    QUEUED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SERVER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    result: Result
    worker: str
    queued_seconds: float
    server_seconds: float
    error_code: str
    error_message: str
    def __init__(self, request_id: _Optional[str] = ..., result: _Optional[_Union[Result, _Mapping]] = ..., worker: _Optional[str] = ..., queued_seconds: _Optional[float] = ..., server_seconds: _Optional[float] = ..., error_code: _Optional[str] = ..., error_message: _Optional[str] = ...) -> None: ...

class PrepareRequest(_message.Message):
    __slots__ = ("instance", "compile")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    COMPILE_FIELD_NUMBER: _ClassVar[int]
    instance: InstanceRef
    compile: _containers.RepeatedCompositeFieldContainer[Configuration]
    def __init__(self, instance: _Optional[_Union[InstanceRef, _Mapping]] = ..., compile: _Optional[_Iterable[_Union[Configuration, _Mapping]]] = ...) -> None: ...

class PrepareResponse(_message.Message):
    __slots__ = ("device_bytes", "workers_prepared", "compile_errors")
    DEVICE_BYTES_FIELD_NUMBER: _ClassVar[int]
    WORKERS_PREPARED_FIELD_NUMBER: _ClassVar[int]
    COMPILE_ERRORS_FIELD_NUMBER: _ClassVar[int]
    device_bytes: int
    workers_prepared: int
    compile_errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, device_bytes: _Optional[int] = ..., workers_prepared: _Optional[int] = ..., compile_errors: _Optional[_Iterable[str]] = ...) -> None: ...

class ServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerInfo(_message.Message):
    __slots__ = ("version", "gpu", "engine", "workers", "workers_ready", "queue_depth", "in_flight", "replays_completed", "worker_restarts", "compile_cache_entries", "compile_cache_hits", "compile_cache_misses", "prepared_instance_bytes", "capabilities", "store", "watchdog_seconds", "gpu_name", "arch", "gpu_memory_bytes")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_READY_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    REPLAYS_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    WORKER_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    COMPILE_CACHE_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    COMPILE_CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    COMPILE_CACHE_MISSES_FIELD_NUMBER: _ClassVar[int]
    PREPARED_INSTANCE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    WATCHDOG_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GPU_NAME_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    version: str
    gpu: int
    engine: str
    workers: int
    workers_ready: int
    queue_depth: int
    in_flight: int
    replays_completed: int
    worker_restarts: int
    compile_cache_entries: int
    compile_cache_hits: int
    compile_cache_misses: int
    prepared_instance_bytes: int
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    store: str
    watchdog_seconds: float
    gpu_name: str
    arch: str
    gpu_memory_bytes: int
    def __init__(self, version: _Optional[str] = ..., gpu: _Optional[int] = ..., engine: _Optional[str] = ..., workers: _Optional[int] = ..., workers_ready: _Optional[int] = ..., queue_depth: _Optional[int] = ..., in_flight: _Optional[int] = ..., replays_completed: _Optional[int] = ..., worker_restarts: _Optional[int] = ..., compile_cache_entries: _Optional[int] = ..., compile_cache_hits: _Optional[int] = ..., compile_cache_misses: _Optional[int] = ..., prepared_instance_bytes: _Optional[int] = ..., capabilities: _Optional[_Iterable[str]] = ..., store: _Optional[str] = ..., watchdog_seconds: _Optional[float] = ..., gpu_name: _Optional[str] = ..., arch: _Optional[str] = ..., gpu_memory_bytes: _Optional[int] = ...) -> None: ...
