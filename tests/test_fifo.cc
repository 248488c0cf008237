/*
 * test_fifo.cc - the trigger FIFO from host threads (the same protocol GPUs use): the bit
 * layout, many producers at once (nothing lost or duplicated, each producer's order kept),
 * wrap-around, back-pressure, and the bounded waits.
 */
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "maco_test.h"
#include "proxy/fifo.h"

namespace
{

class Fifo : public maco_test::Test
{
  protected:
    void Make(uint64_t capacity)
    {
        maco_device_wait_bound_t bound{};
        ASSERT_EQ(maco__fifo_create(&f_, capacity, 0, &bound, -1), MACO_OK);
        made_ = true;
        *f_.state = MACO_PROXY_RUNNING;
    }
    void TearDown() override
    {
        if (made_)
            maco__fifo_destroy(&f_);
        maco_test::Test::TearDown();
    }
    maco__fifo_t f_{};
    bool made_ = false;
};

TEST_F(Fifo, TriggerFieldsRoundTripAtTheirWidths)
{
    const uint64_t max_off = (64ull << 30) - 1; /* 64 GiB */
    maco_trigger_t t =
        maco_trigger_make(MACO_TRIGGER_DATA | MACO_TRIGGER_SIGNAL | MACO_TRIGGER_FLUSH, 4095,
                          max_off, max_off - 5, 0xFFFFFFFFull);
    EXPECT_EQ(maco_trigger_dst_offset(t), max_off);
    EXPECT_EQ(maco_trigger_src_offset(t), max_off - 5);
    EXPECT_EQ(maco_trigger_size(t), 0xFFFFFFFFull);
    EXPECT_EQ(maco_trigger_channel(t), 4095u);
    EXPECT_EQ(maco_trigger_type(t), 7u);
    EXPECT_EQ(t.dst_word >> 63, 0u) << "the parity bit is the push's";
    maco_trigger_t z = maco_trigger_make(MACO_TRIGGER_SIGNAL, 1, 0, 0, 0);
    EXPECT_EQ(maco_trigger_size(z), 0u);
    EXPECT_EQ(maco_trigger_type(z), MACO_TRIGGER_SIGNAL);
    EXPECT_EQ(maco_fifo_parity(0, 8), 1ull << 63);
    EXPECT_EQ(maco_fifo_parity(8, 8), 0ull);
    EXPECT_EQ(maco_fifo_parity(16, 8), 1ull << 63);
}

TEST_F(Fifo, InlineTriggersCarryTheirValue)
{
    const uint64_t max_off = MACO_TRIGGER_MAX_OFFSET;
    maco_trigger_t t = maco_trigger_make_inline(MACO_TRIGGER_DATA | MACO_TRIGGER_SIGNAL, 4095,
                                                max_off & ~7ull, 0xFEDCBA9876543210ull, 8);
    EXPECT_EQ(maco_trigger_inline_bytes(t), 8u);
    EXPECT_EQ(t.src_word, 0xFEDCBA9876543210ull) << "the value is src_word, all 64 bits";
    EXPECT_EQ(maco_trigger_dst_offset(t), max_off & ~7ull);
    EXPECT_EQ(maco_trigger_channel(t), 4095u);
    EXPECT_EQ(maco_trigger_type(t), MACO_TRIGGER_DATA | MACO_TRIGGER_SIGNAL);
    EXPECT_EQ(t.dst_word >> 63, 0u) << "the parity bit is the push's";
    maco_trigger_t w = maco_trigger_make_inline(MACO_TRIGGER_DATA, 7, 12, 0x1122334455667788ull, 4);
    EXPECT_EQ(maco_trigger_inline_bytes(w), 4u);
    EXPECT_EQ(w.src_word, 0x55667788ull) << "a 4-byte value keeps its low 32 bits";
    EXPECT_EQ(maco_trigger_dst_offset(w), 12u);
    /* An ordinary trigger, even at full widths, is not inline. */
    maco_trigger_t d = maco_trigger_make(MACO_TRIGGER_DATA, 4095, max_off, max_off, 0xFFFFFFFFull);
    EXPECT_EQ(maco_trigger_inline_bytes(d), 0u);
    /* The parity bit does not disturb the inline bits. */
    w.dst_word |= maco_fifo_parity(0, 8);
    EXPECT_EQ(maco_trigger_inline_bytes(w), 4u);
}

TEST_F(Fifo, WrapsAroundManyLaps)
{
    ASSERT_NO_FATAL_FAILURE(Make(8));
    uint64_t next = 0;
    for (uint64_t i = 0; i < 1000; i++) {
        uint64_t pos;
        ASSERT_EQ(maco__fifo_host_push(&f_.view, maco_trigger_make(MACO_TRIGGER_DATA, 1, i, i, i),
                                       1000, &pos),
                  MACO_OK);
        EXPECT_EQ(pos, i);
        if (i % 5 == 4) { /* consume in bursts, so the ring is partly full across laps */
            maco_trigger_t t;
            while (maco__fifo_peek(&f_, &t)) {
                ASSERT_EQ(maco_trigger_size(t), next) << "lap " << next / 8;
                maco__fifo_pop(&f_);
                next++;
            }
        }
    }
    EXPECT_GE(next, 995u);
}

TEST_F(Fifo, ManyProducersLoseNothingAndKeepTheirOrder)
{
    ASSERT_NO_FATAL_FAILURE(Make(1024));
    const int kProducers = 8;
    const uint64_t kEach = 1000000;
    std::atomic<int> failures{ 0 };
    std::vector<std::thread> producers;
    for (int p = 0; p < kProducers; p++) {
        producers.emplace_back([&, p] {
            for (uint64_t i = 0; i < kEach; i++) {
                uint64_t pos;
                /* Producer id in the channel field, sequence number in the size field. */
                if (maco__fifo_host_push(&f_.view,
                                         maco_trigger_make(MACO_TRIGGER_DATA, (uint32_t)p, 0, 0, i),
                                         60000, &pos) != MACO_OK)
                    failures++;
            }
        });
    }
    std::vector<uint64_t> next(kProducers, 0);
    uint64_t total = 0, out_of_order = 0;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (total < kProducers * kEach && std::chrono::steady_clock::now() < deadline) {
        maco_trigger_t t;
        if (!maco__fifo_peek(&f_, &t)) {
            std::this_thread::yield();
            continue;
        }
        uint32_t p = maco_trigger_channel(t);
        out_of_order += p >= (uint32_t)kProducers || maco_trigger_size(t) != next[p];
        if (p < (uint32_t)kProducers)
            next[p] = maco_trigger_size(t) + 1;
        maco__fifo_pop(&f_);
        total++;
    }
    for (auto &t : producers)
        t.join();
    EXPECT_EQ(failures.load(), 0);
    EXPECT_EQ(total, kProducers * kEach);
    EXPECT_EQ(out_of_order, 0u);
    for (int p = 0; p < kProducers; p++)
        EXPECT_EQ(next[p], kEach) << "producer " << p;
    maco_trigger_t t;
    EXPECT_FALSE(maco__fifo_peek(&f_, &t)) << "nothing beyond what was pushed";
}

TEST_F(Fifo, FullRingMakesPushersWaitUntilTheConsumerFreesSlots)
{
    ASSERT_NO_FATAL_FAILURE(Make(4));
    std::atomic<int> pushed{ 0 };
    std::thread producer([&] {
        for (int i = 0; i < 40; i++) {
            uint64_t pos;
            if (maco__fifo_host_push(&f_.view,
                                     maco_trigger_make(MACO_TRIGGER_DATA, 0, 0, 0, (uint64_t)i),
                                     10000, &pos) == MACO_OK)
                pushed++;
        }
    });
    /* The producer fills 4 slots and must then wait for the consumer. */
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(pushed.load(), 4);
    for (int i = 0; i < 40; i++) {
        maco_trigger_t t;
        auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!maco__fifo_peek(&f_, &t) && std::chrono::steady_clock::now() < until)
            std::this_thread::yield();
        ASSERT_EQ(maco_trigger_size(t), (uint64_t)i);
        maco__fifo_pop(&f_);
    }
    producer.join();
    EXPECT_EQ(pushed.load(), 40);
}

TEST_F(Fifo, FullRingTimesOutOrFailsWhenTheProxyStopped)
{
    ASSERT_NO_FATAL_FAILURE(Make(2));
    uint64_t pos;
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(maco__fifo_host_push(&f_.view, maco_trigger_make(MACO_TRIGGER_DATA, 0, 0, 0, 1),
                                       100, &pos),
                  MACO_OK);
    maco_test::AllowLog("stayed full");
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(
        maco__fifo_host_push(&f_.view, maco_trigger_make(MACO_TRIGGER_DATA, 0, 0, 0, 1), 300, &pos),
        MACO_ERR_TIMEOUT);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(s, 0.29);
    EXPECT_LT(s, 5.0);
    maco_test::AllowLog("proxy is not running");
    *f_.state = MACO_PROXY_STOPPED;
    EXPECT_EQ(maco__fifo_host_push(&f_.view, maco_trigger_make(MACO_TRIGGER_DATA, 0, 0, 0, 1),
                                   60000, &pos),
              MACO_ERR_REMOTE);
    maco_test::AllowLog("proxy stopped");
    EXPECT_EQ(maco__fifo_host_wait_flush(&f_.view, 0, 60000), MACO_ERR_REMOTE);
}

/* A push that fails (ring full past its bound, or the proxy stopped) leaves no unpublished
 * slot behind: once there is room the next push lands right after the earlier triggers.
 * (Regression: the failed push had reserved a position it never published, and the
 * consumer stopped there forever.) */
TEST_F(Fifo, AFailedPushLeavesNoHole)
{
    ASSERT_NO_FATAL_FAILURE(Make(2));
    uint64_t pos;
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(maco__fifo_host_push(&f_.view, maco_trigger_make(MACO_TRIGGER_DATA, 0, 0, 0, 1),
                                       100, &pos),
                  MACO_OK);
    maco_test::AllowLog("stayed full");
    EXPECT_EQ(
        maco__fifo_host_push(&f_.view, maco_trigger_make(MACO_TRIGGER_DATA, 0, 0, 0, 2), 100, &pos),
        MACO_ERR_TIMEOUT);
    maco_test::AllowLog("proxy is not running");
    *f_.state = MACO_PROXY_STOPPED;
    EXPECT_EQ(
        maco__fifo_host_push(&f_.view, maco_trigger_make(MACO_TRIGGER_DATA, 0, 0, 0, 3), 100, &pos),
        MACO_ERR_REMOTE);
    *f_.state = MACO_PROXY_RUNNING;
    maco_trigger_t t;
    for (int i = 0; i < 2; i++) {
        ASSERT_TRUE(maco__fifo_peek(&f_, &t));
        maco__fifo_pop(&f_);
    }
    ASSERT_EQ(
        maco__fifo_host_push(&f_.view, maco_trigger_make(MACO_TRIGGER_DATA, 0, 0, 0, 7), 100, &pos),
        MACO_OK);
    EXPECT_EQ(pos, 2u);
    ASSERT_TRUE(maco__fifo_peek(&f_, &t)) << "the consumer is stuck at a slot nobody published";
    EXPECT_EQ(maco_trigger_size(t), 7u);
}

} // namespace
