/* Pacing where there is no tc: CLUSTERTOOL_LINK_RATE (e.g. 1gbit, 400mbit, 10gbit, 125mbps; unset,
 * empty, 0 or none: unpaced) puts one token bucket per process and direction in front of every
 * socket the plugin (net and CollNet) and clustertool-reducer open: a NIC limits a host, not a
 * connection. All sockets of the process draw on the same two buckets (thread-safe).
 *
 * The bucket holds at most ct_pace_burst() bytes: 2 ms at the rate, at least 64 KiB. A grant is
 * never more than the bucket holds, never more than a quarter of the burst (so one taker cannot
 * sweep the bucket while others wait) and, unless want is smaller, never less than a grain of
 * 4-64 KiB (250 us at the rate): a caller polling in a tight loop moves whole grains, not the
 * few bytes that refilled since its last call. A taker left short (it wanted more than it got, or
 * sleeps in ct_pace_wait) that comes back late finds up to 20 ms at the rate, not just a burst: a
 * NIC keeps draining its queue while the host's threads are elsewhere, so a busy box's late
 * wake-ups do not lower the rate.
 *
 * Non-blocking use (an epoll loop, NCCL's proxy thread): n = ct_pace_take(dir, want, &wait_us);
 * move at most n bytes; ct_pace_refund(dir, n - moved) for what the socket did not take; when
 * n == 0, come back after wait_us (never sleep on a thread that others wait on).
 * Blocking use: ct_pace_wait(dir, len) before moving len bytes; keep len to about a burst, since
 * the bytes go out at once after the wait. */
#ifndef CT_PACE_H
#define CT_PACE_H
#include <stddef.h>
#include <stdint.h>

enum { CT_PACE_TX = 0, CT_PACE_RX = 1 };

/* The rate in bits per second read from CLUSTERTOOL_LINK_RATE at first use; 0 = unpaced. A value
 * that is not a rate is reported (WARN) and leaves the process unpaced. */
uint64_t ct_pace_rate_bits(void);
/* Bytes that may move now in dir, at most want (want itself when unpaced). When the grant is 0,
 * *wait_us (if not NULL) says how long until a grant is possible (at least 1, at most 1 s). */
size_t ct_pace_take(int dir, size_t want, long* wait_us);
/* Give back tokens taken but not used (the socket took fewer bytes than granted). */
void ct_pace_refund(int dir, size_t unused);
/* Sleep until len bytes may move in dir, and take them (no-op when unpaced). Threads that call it
 * at once are served in the order they called (the bucket goes into debt; each sleeps off its
 * place in the queue). */
void ct_pace_wait(int dir, size_t len);
/* The bucket's size in bytes (0 when unpaced). */
size_t ct_pace_burst(void);
/* A tc rate, as tc(8) reads one: a number with bit, kbit, mbit, gbit, tbit (SI) or kibit, mibit,
 * gibit, tibit (IEC) for bits per second, bps, kbps, mbps, gbps, tbps or kibps ... tibps for
 * bytes per second, case-insensitive; a bare number is bits per second. Returns bits per second;
 * 0 for none, 0 or empty (unpaced); -1 when malformed or below 1 bit/s. For tests and the proof. */
int64_t ct_pace_parse_rate(const char* s);
#endif
