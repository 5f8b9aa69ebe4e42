"""The card's ``tensor_model_config`` section: tensor inputs, outputs and parameters."""

from __future__ import annotations

from workerset_admission.card.schema import (
    BOOL,
    F64,
    I64,
    STR,
    U8,
    U64,
    EnumT,
    ExtTagged,
    Field,
    MapT,
    Opt,
    Seq,
    Struct,
    none,
)

__all__ = ["TENSOR_DATA_TYPES", "TENSOR_METADATA", "TENSOR_MODEL_CONFIG", "TENSOR_PARAMETER"]

TENSOR_PARAMETER = ExtTagged(
    {"bool": BOOL, "int64": I64, "string": STR, "double": F64, "uint64": U64}
)


TENSOR_DATA_TYPES = (
    "Bool",
    "Uint8",
    "Uint16",
    "Uint32",
    "Uint64",
    "Int8",
    "Int16",
    "Int32",
    "Int64",
    "Float16",
    "BFloat16",
    "Float32",
    "Float64",
    "Bytes",
)
TENSOR_METADATA = Struct(
    "TensorMetadata",
    (
        Field("name", STR),
        Field("data_type", EnumT(TENSOR_DATA_TYPES)),
        Field("shape", Seq(I64)),
        Field("parameters", MapT(TENSOR_PARAMETER), default=dict),
    ),
    deny_unknown=True,
)
TENSOR_MODEL_CONFIG = Struct(
    "TensorModelConfig",
    (
        Field("name", STR),
        Field("inputs", Seq(TENSOR_METADATA)),
        Field("outputs", Seq(TENSOR_METADATA)),
        Field("triton_model_config", Opt(Seq(U8)), default=none),
    ),
    deny_unknown=True,
)
