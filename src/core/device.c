/* device.c -- device type names and parsing of "type[:id]" strings.
 *
 * A device type this table has no name for (a value newer than the header,
 * or 5 and 6) is a foreign device: it is named "device<N>" ("device99:0"),
 * and that name parses back.  Types 0 and below are no device at all. */
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* Indexed by DLDeviceType; NULL marks the unassigned values 0, 5 and 6. */
static const char *const device_names[] = {
    NULL,          /* 0 */
    "cpu",         /* kDLCPU */
    "cuda",        /* kDLCUDA */
    "cuda_host",   /* kDLCUDAHost */
    "opencl",      /* kDLOpenCL */
    NULL,          /* 5 */
    NULL,          /* 6 */
    "vulkan",      /* kDLVulkan */
    "metal",       /* kDLMetal */
    "vpi",         /* kDLVPI */
    "rocm",        /* kDLROCM */
    "rocm_host",   /* kDLROCMHost */
    "ext_dev",     /* kDLExtDev */
    "cuda_managed",/* kDLCUDAManaged */
    "oneapi",      /* kDLOneAPI */
    "webgpu",      /* kDLWebGPU */
    "hexagon",     /* kDLHexagon */
    "maia",        /* kDLMAIA */
    "trn",         /* kDLTrn */
    "tpu",         /* kDLTPU (post-1.3) */
    "tpu_host",    /* kDLTPUHost (post-1.3) */
    "ascend",      /* kDLAscend (post-1.3) */
};

#define DEVICE_NAMES_LEN \
  ((int32_t)(sizeof device_names / sizeof device_names[0]))

const char *dlb_device_type_name(int32_t device_type) {
  if (device_type < 0 || device_type >= DEVICE_NAMES_LEN) return NULL;
  return device_names[device_type];
}

const char *dlb_device_describe(DLDevice device, char *buf, size_t buflen) {
  if (buf == NULL || buflen == 0) return buf;
  const char *name = dlb_device_type_name((int32_t)device.device_type);
  /* The CPU is one device: "cpu", not "cpu:0".  Every other type always
   * shows its index, so "cuda" alone never hides which GPU. */
  if (device.device_type == kDLCPU && device.device_id == 0)
    snprintf(buf, buflen, "cpu");
  else if (name != NULL)
    snprintf(buf, buflen, "%s:%d", name, (int)device.device_id);
  else
    snprintf(buf, buflen, "device%d:%d", (int)device.device_type,
             (int)device.device_id);
  return buf;
}

bool dlb_device_type_known(int32_t device_type) {
  return dlb_device_type_name(device_type) != NULL;
}

bool dlb_device_type_valid(int32_t device_type) { return device_type >= 1; }

/* The N of a generic name "device<N>" (type_len characters of name):
 * decimal digits, no sign, no leading zero, in [1, INT32_MAX]; -1 when the
 * text is not such a name. */
static int32_t generic_device_type(const char *name, size_t type_len) {
  static const char prefix[] = "device";
  const size_t plen = sizeof prefix - 1;
  if (type_len <= plen || strncmp(name, prefix, plen) != 0) return -1;
  if (name[plen] < '1' || name[plen] > '9') return -1;
  int64_t v = 0;
  for (size_t i = plen; i < type_len; i++) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
    if (v > INT32_MAX) return -1;
  }
  return (int32_t)v;
}

bool dlb_device_is_host_accessible(DLDevice device) {
  switch ((int32_t)device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
    case kDLROCMHost:
    case kDLCUDAManaged:
      return true;
    default:
      return false;
  }
}

int dlb_device_from_name(const char *name, DLDevice *out, dlb_error *err) {
  if (name == NULL)
    return dlb_error_set(err, DLB_EINVAL, "device name is NULL");
  if (out == NULL)
    return dlb_error_set(err, DLB_EINVAL, "device output pointer is NULL");
  const char *colon = strchr(name, ':');
  size_t type_len = colon != NULL ? (size_t)(colon - name) : strlen(name);
  int32_t type = -1;
  for (int32_t i = 0; i < DEVICE_NAMES_LEN; i++) {
    const char *n = device_names[i];
    if (n != NULL && strlen(n) == type_len && strncmp(n, name, type_len) == 0) {
      type = i;
      break;
    }
  }
  if (type < 0) type = generic_device_type(name, type_len);
  if (type < 0)
    return dlb_error_set(err, DLB_EINVAL,
                         "unknown device \"%.64s\" (expected a type such as "
                         "\"cpu\", \"cuda\", \"rocm\", \"tpu_host\" or "
                         "\"device<N>\" for DLPack device type N, "
                         "optionally \":<id>\")",
                         name);
  int64_t id = 0;
  if (colon != NULL) {
    const char *p = colon + 1;
    if (*p == '-')
      return dlb_error_set(err, DLB_EINVAL,
                           "bad device \"%.64s\": the device id must not be "
                           "negative",
                           name);
    if (*p == '\0')
      return dlb_error_set(err, DLB_EINVAL,
                           "bad device \"%.64s\": expected a device id after "
                           "':'",
                           name);
    for (; *p != '\0'; p++) {
      if (*p < '0' || *p > '9')
        return dlb_error_set(err, DLB_EINVAL,
                             "bad device \"%.64s\": the device id must be "
                             "decimal digits only",
                             name);
      id = id * 10 + (*p - '0');
      if (id > INT32_MAX)
        return dlb_error_set(err, DLB_EINVAL,
                             "bad device \"%.64s\": the device id exceeds "
                             "INT32_MAX",
                             name);
    }
  }
  out->device_type = (DLDeviceType)type;
  out->device_id = (int32_t)id;
  return DLB_OK;
}
