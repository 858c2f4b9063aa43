/*
 * The DLPack ABI (dmlc/dlpack, include/dlpack/dlpack.h, version 1.x): the
 * few types the pinpool module produces, declared here so that building
 * needs no DLPack checkout. Layouts and values are those of the DLPack
 * header; only what a 1-D byte array on host memory needs is named.
 */
#ifndef PINPOOL_DLPACK_H
#define PINPOOL_DLPACK_H

#include <stdint.h>

/* The version this module writes into DLManagedTensorVersioned. */
#define PP_DLPACK_MAJOR 1
#define PP_DLPACK_MINOR 0

typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;

/* DLDeviceType: an int-sized enum in the DLPack header. */
typedef int32_t pp_dl_device_type_t;
enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3, /* pinned host memory */
  kDLCUDAManaged = 13,
};

typedef struct {
  pp_dl_device_type_t device_type;
  int32_t device_id;
} DLDevice;

enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2 };

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides; /* in elements; never NULL for ndim > 0 (DLPack 1.x) */
  uint64_t byte_offset;
} DLTensor;

/* The legacy capsule "dltensor". */
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

#define DLPACK_FLAG_BITMASK_READ_ONLY (UINT64_C(1) << 0)
#define DLPACK_FLAG_BITMASK_IS_COPIED (UINT64_C(1) << 1)

/* The versioned capsule "dltensor_versioned". */
typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;

#endif /* PINPOOL_DLPACK_H */
