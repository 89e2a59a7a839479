/* chan_util.h -- reading a stage's channel in the unit tests that run a
 * stage row through the real skeleton over a socketpair (test_stage,
 * test_talker, test_voicebox_stage). Include after cmocka.h. */

#ifndef OMNI_CHAN_UTIL_H
#define OMNI_CHAN_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "omni_proto.h"

/* n bytes from fd: all of them, or the test fails. */
static inline void chan_read(int fd, uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t k = recv(fd, p, n, MSG_WAITALL);

        assert_true(k > 0);
        p += k;
        n -= (size_t) k;
    }
}

/* The next frame on fd: its type; its payload into p (at most cap bytes,
 * else the test fails), its length in *len. */
static inline uint8_t chan_frame(int fd, uint8_t *p, size_t cap, size_t *len)
{
    uint8_t      h[OMNI_FRAME_HDR];
    OmniFrameHdr hdr;

    chan_read(fd, h, sizeof(h));
    omni_hdr_decode(&hdr, h);
    assert_true(hdr.len <= cap);
    chan_read(fd, p, hdr.len);
    *len = hdr.len;
    return hdr.type;
}

#endif
