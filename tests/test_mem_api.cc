/* test_mem_api.cc - maco/memory.h's calls that need no GPU: argument errors. */
#include <cstdint>
#include <string>
#include <vector>

#include "maco/maco.h"
#include "maco_test.h"

class MemApi : public maco_test::Test
{
};

/* maco_mem_copy_batch refuses bad entries before it enqueues anything (no GPU needed: the
 * checks come first, and an all-empty batch makes no CUDA call). */
TEST_F(MemApi, CopyBatchRefusesBadEntriesNamingThem)
{
    char a[64], b[64];
    EXPECT_EQ(maco_mem_copy_batch(nullptr, 0, nullptr), MACO_OK);
    maco_mem_copy_t empty[2] = { { nullptr, nullptr, 0 }, { a, b, 0 } };
    EXPECT_EQ(maco_mem_copy_batch(empty, 2, nullptr), MACO_OK);
    struct Case {
        std::vector<maco_mem_copy_t> copies;
        size_t count;
        const char *text;
    };
    std::vector<maco_mem_copy_t> bad_dst = { { a, b, 16 }, { nullptr, b, 8 } };
    std::vector<maco_mem_copy_t> bad_src = { { a, nullptr, 8 } };
    std::vector<maco_mem_copy_t> overlap = { { a, b, 64 }, { a + 8, a, 16 } };
    /* 16 bytes from near the top of the address space: the end wraps (its overlap test would
     * compare wrapped sums). */
    std::vector<maco_mem_copy_t> wraps = { { a, reinterpret_cast<const void *>(UINTPTR_MAX - 7),
                                             16 } };
    const Case cases[] = {
        { {}, 1, "copies is NULL but count is 1" },
        { bad_dst, 2, "copies[1] has a NULL dst and 8 bytes" },
        { bad_src, 1, "copies[0] has a NULL src and 8 bytes" },
        { overlap, 2, "copies[1]: its 16 bytes" },
        { bad_dst, MACO_MEM_COPY_BATCH_MAX + 1, "above MACO_MEM_COPY_BATCH_MAX (4096)" },
        { wraps, 1, "run past the end of the address space" },
    };
    for (const Case &c : cases) {
        maco_test::AllowLog(c.text);
        const maco_mem_copy_t *p = c.copies.empty() ? nullptr : c.copies.data();
        EXPECT_EQ(maco_mem_copy_batch(p, c.count, nullptr), MACO_ERR_INVALID_ARGUMENT) << c.text;
        std::string msg = maco_log_last_error();
        EXPECT_NE(msg.find(c.text), std::string::npos) << msg;
    }
}
