/* Pacing where there is no tc: CLUSTERTOOL_LINK_RATE (e.g. 1gbit, 400mbit, 10gbit, 125M; unset,
 * empty, 0 or none: unpaced) puts one token bucket per process and direction in front of every
 * socket the plugin (net and CollNet) and clustertool-reducer open: a NIC limits a host, not a
 * connection. All sockets of the process draw on the same two buckets (thread-safe).
 *
 * Non-blocking use (an epoll loop): n = ct_pace_take(dir, want, &wait_us); move at most n bytes;
 * ct_pace_refund(dir, n - moved) for what the socket did not take; when n == 0, come back after
 * wait_us. Blocking use: ct_pace_wait(dir, len) before moving len bytes. */
#ifndef CT_PACE_H
#define CT_PACE_H
#include <stddef.h>
#include <stdint.h>

enum { CT_PACE_TX = 0, CT_PACE_RX = 1 };

/* The rate in bits per second read from CLUSTERTOOL_LINK_RATE at first use; 0 = unpaced. */
uint64_t ct_pace_rate_bits(void);
/* Bytes that may move now in dir, at most want (want itself when unpaced). When the grant is 0,
 * *wait_us (if not NULL) says how long until some may move. */
size_t ct_pace_take(int dir, size_t want, long* wait_us);
/* Give back tokens taken but not used (the socket took fewer bytes than granted). */
void ct_pace_refund(int dir, size_t unused);
/* Sleep until len bytes may move in dir, and take them (no-op when unpaced). */
void ct_pace_wait(int dir, size_t len);
/* "1gbit" -> 1000000000 (k/m/g = 1000s, bit/bps; a bare number or a K/M/G byte suffix = bytes/s x 8);
 * 0 for none/0/empty; -1 when malformed. For tests and the proof. */
int64_t ct_pace_parse_rate(const char* s);
#endif
