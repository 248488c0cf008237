/*
 * library.cpp - maco._maco's module-level functions: versions and names, the configuration
 * table, CUDA devices, unique ids (also the environment's job), groups, batched copies, GEMM tile
 * plans, fused-operator scratch sizes and the plan verifier.
 */
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.h"
#include "errors.h"

namespace maco_py
{

namespace
{

nb::bytes unique_id_create()
{
    maco_unique_id_t uid;
    checked("maco_unique_id_create", nullptr, [&] { return maco_unique_id_create(&uid); });
    return nb::bytes(reinterpret_cast<const char *>(uid.bytes), MACO_UNIQUE_ID_BYTES);
}

/* The job the environment describes, by the C library's launcher rules (maco/bootstrap.h):
 * (unique id, rank, size); the id may travel through the launcher's store (blocking). */
nb::tuple unique_id_from_env()
{
    maco_unique_id_t uid;
    int rank = -1, nranks = 0;
    checked("maco_unique_id_from_env", nullptr,
            [&] { return maco_unique_id_from_env(&uid, &rank, &nranks); });
    return nb::make_tuple(
        nb::bytes(reinterpret_cast<const char *>(uid.bytes), MACO_UNIQUE_ID_BYTES), rank, nranks);
}

} // namespace

void bind_library(nb::module_ &m)
{
    m.def(
        "version", [] { return std::string(maco_version_string()); },
        "The C library's version, \"MAJOR.MINOR.PATCH\".");
    m.def(
        "status_string", [](int s) { return std::string(maco_status_string((maco_status_t)s)); },
        nb::arg("status"), "The constant text of a status code.");
    m.def(
        "datatype_size", [](int d) { return maco_datatype_size((maco_datatype_t)d); },
        nb::arg("datatype"), "Bytes per element of a MACO datatype (0 if unknown).");
    m.def(
        "datatype_name", [](int d) { return std::string(maco_datatype_name((maco_datatype_t)d)); },
        nb::arg("datatype"), "Name of a MACO datatype (\"unknown\" if out of range).");
    m.def(
        "redop_name", [](int o) { return std::string(maco_redop_name((maco_redop_t)o)); },
        nb::arg("op"), "Name of a MACO reduction (\"unknown\" if out of range).");
    m.def(
        "cuda_device_count",
        [] {
            char why[512] = { 0 };
            int n = maco_cuda_device_count(why, sizeof(why));
            return std::make_pair(n, std::string(why));
        },
        "(number of usable CUDA devices, why there are none or \"\").");
    m.def(
        "plan_verify_file",
        [](const std::string &path) {
            std::string report(1 << 16, '\0');
            maco_status_t st;
            {
                nb::gil_scoped_release release;
                st = maco_plan_verify_file(path.c_str(), report.data(), report.size());
            }
            report.resize(std::strlen(report.c_str()));
            return std::make_pair(static_cast<int>(st), report);
        },
        nb::arg("path"),
        "(status, report) of MACO's plan verifier on a plan file (maco_plan_verify_file): "
        "status 0 and \"\" when the plan is valid.");
    m.def(
        "fused_scratch_bytes",
        [](int kind, int nranks, uint32_t m, uint32_t n, uint32_t k, int out_type) {
            size_t bytes = 0;
            checked("maco_fused_gemm_scratch_bytes", nullptr, [&] {
                return maco_fused_gemm_scratch_bytes(static_cast<maco_fused_op_t>(kind), nranks, m,
                                                     n, k, static_cast<maco_datatype_t>(out_type),
                                                     &bytes);
            });
            return bytes;
        },
        nb::arg("kind"), nb::arg("nranks"), nb::arg("m"), nb::arg("n"), nb::arg("k"),
        nb::arg("out_type"),
        "Bytes of scratch a fused operator needs on every rank: maco_fused_gemm_scratch_bytes.");
    m.def(
        "fused_scratch_bytes_mode",
        [](int kind, int mode, int nranks, uint32_t m, uint32_t n, uint32_t k, int out_type) {
            size_t bytes = 0;
            checked("maco_fused_gemm_scratch_bytes_mode", nullptr, [&] {
                return maco_fused_gemm_scratch_bytes_mode(
                    static_cast<maco_fused_op_t>(kind), mode, nranks, m, n, k,
                    static_cast<maco_datatype_t>(out_type), &bytes);
            });
            return bytes;
        },
        nb::arg("kind"), nb::arg("mode"), nb::arg("nranks"), nb::arg("m"), nb::arg("n"),
        nb::arg("k"), nb::arg("out_type"),
        "Bytes of scratch a fused operator needs on every rank in communication mode `mode`: "
        "maco_fused_gemm_scratch_bytes_mode.");
    m.def(
        "fused_choose_comm",
        [](int kind, int nranks, uint32_t m, uint32_t n, uint32_t k, int out_type) {
            maco_fused_comm_t mode = MACO_FUSED_COMM_SM;
            checked("maco_fused_gemm_choose_comm", nullptr, [&] {
                return maco_fused_gemm_choose_comm(static_cast<maco_fused_op_t>(kind), nranks, m, n,
                                                   k, static_cast<maco_datatype_t>(out_type),
                                                   &mode);
            });
            return static_cast<int>(mode);
        },
        nb::arg("kind"), nb::arg("nranks"), nb::arg("m"), nb::arg("n"), nb::arg("k"),
        nb::arg("out_type"),
        "The communication mode (maco_fused_comm_t: 0 SM, 1 copy engines) that "
        "MACO_FUSED_COMM_AUTO takes for a fused operator: maco_fused_gemm_choose_comm.");
    m.def(
        "plan_gemm_tiles",
        [](uint32_t m, uint32_t n, int workers) {
            size_t count = 0;
            checked("maco_gemm_plan_tiles", nullptr,
                    [&] { return maco_gemm_plan_tiles(m, n, workers, nullptr, &count); });
            std::vector<maco_gemm_tile_t> tiles(count);
            checked("maco_gemm_plan_tiles", nullptr,
                    [&] { return maco_gemm_plan_tiles(m, n, workers, tiles.data(), &count); });
            std::vector<std::tuple<uint32_t, uint32_t, uint32_t>> out;
            for (size_t i = 0; i < count; i++)
                out.emplace_back(tiles[i].tile_row, tiles[i].tile_col, tiles[i].tile_n);
            return out;
        },
        nb::arg("m"), nb::arg("n"), nb::arg("workers"),
        "[(tile_row, tile_col, tile_n), ...] in the order to add them: maco_gemm_plan_tiles.");
    m.def(
        "mem_copy_batch",
        [](const std::vector<uintptr_t> &dst, const std::vector<uintptr_t> &src,
           const std::vector<size_t> &bytes, uintptr_t stream) {
            if (dst.size() != src.size() || dst.size() != bytes.size())
                throw nb::value_error(("mem_copy_batch: dst, src and bytes differ in length (" +
                                       std::to_string(dst.size()) + ", " +
                                       std::to_string(src.size()) + ", " +
                                       std::to_string(bytes.size()) + ")")
                                          .c_str());
            std::vector<maco_mem_copy_t> copies(dst.size());
            for (size_t i = 0; i < copies.size(); i++)
                copies[i] = { ptr(dst[i]), ptr(src[i]), bytes[i] };
            checked("maco_mem_copy_batch", nullptr, [&] {
                return maco_mem_copy_batch(copies.data(), copies.size(), stream_of(stream));
            });
        },
        nb::arg("dst"), nb::arg("src"), nb::arg("bytes"), nb::arg("stream"),
        "cudaMemcpyAsync of bytes[i] from src[i] to dst[i] (addresses), in order, on stream "
        "(a cudaStream_t): maco_mem_copy_batch.");
    m.def("unique_id", &unique_id_create,
          "A new 128-byte unique id; rank 0 of the job must be created in this process.");
    m.def("unique_id_from_env", &unique_id_from_env,
          "(unique id, rank, size) of the job the environment describes (launcher detection and "
          "the id through the launcher's store: maco_unique_id_from_env); collective, blocking, "
          "releases the GIL.");
    m.def(
        "group_start",
        [] { checked("maco_group_start", nullptr, [] { return maco_group_start(); }); },
        "Opens a group on this thread (maco_group_start).");
    m.def(
        "group_end", [] { checked("maco_group_end", nullptr, [] { return maco_group_end(); }); },
        "Closes the group and issues it (maco_group_end); releases the GIL.");
    m.def(
        "config",
        [] {
            nb::list out;
            int n = maco_config_count();
            for (int i = 0; i < n; ++i) {
                maco_config_info_t info;
                if (maco_config_describe(i, &info) != MACO_OK)
                    continue;
                out.append(
                    nb::make_tuple(info.name, info.type, info.default_value, info.unit, info.doc));
            }
            return out;
        },
        "The configuration table: (name, type, default, unit, doc) for each MACO_* variable.");
}

} // namespace maco_py
