/* SPDX-License-Identifier: MIT */
/*
 * Build-time check: the constants gpu_rt.c declares for itself match the HIP
 * headers, where they are installed (Debian's libamdhip64-dev). Compiles to
 * nothing elsewhere. CUDA uses the same values (cuda_runtime_api.h).
 */
#if defined(__has_include)
#if __has_include(<hip/hip_runtime_api.h>) && !defined(KVB_NO_HIP_CHECK)
#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__
#endif
#include <hip/hip_runtime_api.h>

_Static_assert(hipSuccess == 0, "hipSuccess");
_Static_assert(hipErrorInvalidValue == 1, "hipErrorInvalidValue");
_Static_assert(hipErrorOutOfMemory == 2, "hipErrorOutOfMemory");
_Static_assert(hipErrorNoDevice == 100, "hipErrorNoDevice");
_Static_assert(hipErrorNotReady == 600, "hipErrorNotReady");
_Static_assert(hipErrorPeerAccessAlreadyEnabled == 704, "peer enabled");
_Static_assert(hipErrorNotSupported == 801, "hipErrorNotSupported");
_Static_assert(hipMemcpyHostToDevice == 1, "hipMemcpyHostToDevice");
_Static_assert(hipMemcpyDeviceToHost == 2, "hipMemcpyDeviceToHost");
_Static_assert(hipMemcpyDeviceToDevice == 3, "hipMemcpyDeviceToDevice");
_Static_assert(hipStreamNonBlocking == 0x1, "hipStreamNonBlocking");
_Static_assert(hipEventDisableTiming == 0x2, "hipEventDisableTiming");
_Static_assert(sizeof(hipIpcMemHandle_t) == 64, "hipIpcMemHandle_t");
#endif
#endif

/* ISO C wants a translation unit to declare something. */
typedef int kvb_gpu_hip_check_unit;
