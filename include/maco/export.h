/*
 * maco/export.h - symbol visibility for the public API.
 *
 * libmaco.so is built with -fvisibility=hidden and a linker version script
 * (src/host/libmaco.map); MACO_API marks the functions that form the ABI.
 */
#ifndef MACO_EXPORT_H
#define MACO_EXPORT_H

#if defined(MACO_BUILDING_LIBRARY) && defined(__GNUC__)
#define MACO_API __attribute__((visibility("default")))
#else
#define MACO_API
#endif

#endif /* MACO_EXPORT_H */
