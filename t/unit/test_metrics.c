/* test_metrics.c -- the frontend's stage metrics through the table of
 * stages (engine/frontend/metrics.h, supervisor.h): metrics_render draws
 * each stage's page, the part every stage has and then the kind's own
 * through its row's render function, and names the stage in the help
 * texts and the memory label; sup_reset_thinker zeroes the thinker's
 * gauges and leaves its counters.
 *
 * The exact exposition for today's one thinker is checked end to end by
 * t/health_metrics.t and t/engine/serve*.t; here the rows are driven
 * directly, with pages whose values are known, a stage without a page,
 * and a second kind whose render is the test's own. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "metrics.h"
#include "supervisor.h"

/* A page with every field set to a distinct value. */
static void fill_page(OmniStats *st) {
    memset(st, 0, sizeof(*st));
    st->magic = STATS_MAGIC;
    st->requests_running = 3;
    st->requests_waiting = 4;
    st->stage_pid = 1234;
    st->heartbeat_us = 5;
    st->step_start_us = 6;
    st->step_max_us = 2500000;
    st->stage_restarts = 7;
    st->stage_hang_kills = 8;
    st->thinker.kv_blocks_total = 100;
    st->thinker.kv_blocks_used = 25;
    st->thinker.kv_blocks_cached = 10;
    st->thinker.kv_blocks_free = 65;
    st->thinker.prefix_cache_queries = 11;
    st->thinker.prefix_cache_hits = 12;
    st->thinker.preemptions = 13;
    st->thinker.prompt_tokens = 14;
    st->thinker.generation_tokens = 15;
    st->thinker.steps = 16;
    st->thinker.step_tokens = 17;
}

/* Renders m (zeroed) with the given stages into a malloc'd string. */
static char *render(const MetricsStage *stages, int n) {
    static Metrics m;
    MetricsGauges  g = { .model = "m", .kernels = "avx2", .stages = stages,
                         .n_stages = n, .connections = 2,
                         .rss_frontend = 4096,
                         .pool = { .n_blocks = 512, .free = 509,
                                   .used = 3 } };
    TextBuf        tb;
    char          *s;

    metrics_init(&m);
    tb_init(&tb);
    metrics_render(&tb, &m, &g);
    assert_false(tb.oom);
    s = strndup(tb.p, tb.len);
    tb_free(&tb);
    assert_non_null(s);
    return s;
}

/* Whether line (a whole line, without its newline) is in text. */
static bool has_line(const char *text, const char *line) {
    size_t n = strlen(line);

    for (const char *p = text; (p = strstr(p, line)) != NULL; p++) {
        if ((p == text || p[-1] == '\n') && p[n] == '\n') return true;
    }
    return false;
}

/* Where line starts in text; fails the test when it is not there. */
static const char *at_line(const char *text, const char *line) {
    assert_true(has_line(text, line));
    return strstr(text, line);
}

static void test_thinker_row(void **state) {
    OmniStats    st;
    MetricsStage s = { "thinker", metrics_thinker, &st, true, 0.25, 8192 };
    char        *out;

    (void) state;
    fill_page(&st);
    out = render(&s, 1);
    /* the generic part, then the thinker's, then the generic rest */
    assert_true(at_line(out, "omni_engine_num_requests_running 3")
                < at_line(out, "omni_engine_kv_cache_usage_perc 0.25"));
    assert_true(at_line(out, "omni_engine_step_tokens_total 17")
                < at_line(out, "omni_engine_stage_restarts_total 7"));
    assert_true(has_line(out, "omni_engine_num_requests_waiting 4"));
    assert_true(has_line(out,
                         "omni_engine_kv_cache_blocks{state=\"free\"} 65"));
    assert_true(has_line(out,
                         "omni_engine_kv_cache_blocks{state=\"used\"} 25"));
    assert_true(has_line(out,
                         "omni_engine_kv_cache_blocks{state=\"cached\"} 10"));
    assert_true(has_line(out, "omni_engine_prefix_cache_hits_total 12"));
    assert_true(has_line(out, "omni_engine_stage_hang_kills_total 8"));
    assert_true(has_line(out, "omni_engine_stage_longest_step_seconds 2.5"));
    assert_true(has_line(out, "# HELP omni_engine_stage_restarts_total Times "
                         "the thinker stage was restarted after it exited."));
    assert_true(has_line(out, "omni_engine_stage_ready 1"));
    assert_true(has_line(out, "omni_engine_stage_heartbeat_age_seconds 0.25"));
    assert_true(has_line(out, "# HELP omni_engine_stage_ready 1 when the "
                         "thinker stage is loaded and serving, and its "
                         "heartbeat is recent."));
    assert_true(at_line(out, "omni_engine_resident_memory_bytes"
                        "{process=\"frontend\"} 4096")
                < at_line(out, "omni_engine_resident_memory_bytes"
                          "{process=\"thinker\"} 8192"));
    free(out);
}

/* No page yet, no process: liveness is still said, the page and the
 * stage's memory are not. */
static void test_no_page(void **state) {
    MetricsStage s = { "thinker", metrics_thinker, NULL, false, 0, -1 };
    char        *out;

    (void) state;
    out = render(&s, 1);
    assert_null(strstr(out, "num_requests_running"));
    assert_null(strstr(out, "kv_cache"));
    assert_true(has_line(out, "omni_engine_stage_ready 0"));
    assert_null(strstr(out, "{process=\"thinker\"}"));
    assert_true(has_line(out, "omni_engine_resident_memory_bytes"
                         "{process=\"frontend\"} 4096"));
    free(out);
}

/* A kind of stage with its own render: its row decides what is drawn
 * between the generic parts, and its name is the one said. */
static void render_toy(TextBuf *b, const OmniStats *stats) {
    tb_printf(b, "toy_part %d\n", (int) stats->requests_running);
}

static void test_own_render(void **state) {
    OmniStats    st;
    MetricsStage s = { "voicebox", render_toy, &st, false, 0, 512 };
    char        *out;

    (void) state;
    fill_page(&st);
    out = render(&s, 1);
    assert_true(at_line(out, "omni_engine_num_requests_waiting 4")
                < at_line(out, "toy_part 3"));
    assert_true(at_line(out, "toy_part 3")
                < at_line(out, "omni_engine_stage_restarts_total 7"));
    assert_null(strstr(out, "kv_cache"));
    assert_null(strstr(out, "thinker stage"));
    assert_true(has_line(out, "# HELP omni_engine_stage_hang_kills_total "
                         "Times the voicebox stage was killed for going "
                         "without a heartbeat for --stage-kill-after."));
    assert_true(has_line(out, "omni_engine_resident_memory_bytes"
                         "{process=\"voicebox\"} 512"));
    free(out);
}

/* The thinker's reset zeroes its gauges and keeps its counters (they
 * add up across restarts); the generic part is not its to touch. */
static void test_reset_thinker(void **state) {
    OmniStats st;

    (void) state;
    fill_page(&st);
    sup_reset_thinker(&st);
    assert_int_equal(st.thinker.kv_blocks_total, 0);
    assert_int_equal(st.thinker.kv_blocks_used, 0);
    assert_int_equal(st.thinker.kv_blocks_cached, 0);
    assert_int_equal(st.thinker.kv_blocks_free, 0);
    assert_int_equal(st.thinker.prefix_cache_queries, 11);
    assert_int_equal(st.thinker.generation_tokens, 15);
    assert_int_equal(st.thinker.step_tokens, 17);
    assert_int_equal(st.requests_running, 3);
    assert_int_equal(st.stage_restarts, 7);
}

/* sup_init builds the row's argv: omni-engine stage NAME, the fd
 * options (the pool's and the owner tag when there is a pool), then the
 * serve options as given. */
static void test_stage_argv(void **state) {
    char     *opts[] = { "--model", "x.gguf" };
    StageProc sp;
    Err       err;

    (void) state;
    assert_int_equal(sup_init(&sp, "talker", sup_reset_thinker, 9, 2, 2,
                              opts, &err), 0);
    assert_string_equal(sp.argv[2], "talker");
    assert_string_equal(sp.argv[7], "--pool-fd");
    assert_string_equal(sp.argv[8], "5");
    assert_string_equal(sp.argv[9], "--stage-owner");
    assert_string_equal(sp.argv[10], "2");
    assert_string_equal(sp.argv[11], "--model");
    assert_null(sp.argv[13]);
    sup_free(&sp);

    assert_int_equal(sup_init(&sp, "talker", sup_reset_thinker, -1, 2, 2,
                              opts, &err), 0);
    assert_string_equal(sp.argv[0], "omni-engine");
    assert_string_equal(sp.argv[1], "stage");
    assert_string_equal(sp.argv[2], "talker");
    assert_string_equal(sp.argv[3], "--ipc-fd");
    assert_string_equal(sp.argv[7], "--model");
    assert_string_equal(sp.argv[8], "x.gguf");
    assert_null(sp.argv[9]);
    assert_true(sp.stats->magic == STATS_MAGIC);
    assert_ptr_equal(sp.reset, sup_reset_thinker);
    sup_free(&sp);
}

/* Three stages: each stage family is one HELP and one line per stage,
 * labelled; the pool's gauges are drawn. */
static void test_three_stages(void **state) {
    OmniStats    st[3];
    MetricsStage s[3] = {
        { "thinker", metrics_thinker, &st[0], true, 0.5, 100 },
        { "talker", metrics_talker, &st[1], true, 0, 200 },
        { "voicebox", metrics_voicebox, &st[2], false, 0, 300 },
    };
    char        *out;

    (void) state;
    for (int i = 0; i < 3; i++) fill_page(&st[i]);
    st[2].stage_restarts = 9;
    st[1].talker.phones = 42;
    st[2].voicebox.slots = 3;
    st[2].voicebox.slots_busy = 2;
    out = render(s, 3);
    assert_true(has_line(out, "omni_engine_talker_phones_total 42"));
    assert_true(has_line(out, "omni_engine_voicebox_slots 3"));
    assert_true(has_line(out, "omni_engine_voicebox_slots_busy 2"));
    assert_true(has_line(out, "omni_engine_stage_restarts_total"
                         "{stage=\"thinker\"} 7"));
    assert_true(has_line(out, "omni_engine_stage_restarts_total"
                         "{stage=\"voicebox\"} 9"));
    assert_true(has_line(out, "omni_engine_stage_ready{stage=\"talker\"} 1"));
    assert_true(has_line(out, "omni_engine_stage_ready{stage=\"voicebox\"} "
                         "0"));
    assert_true(has_line(out, "omni_engine_stage_busy{stage=\"talker\"} 1"));
    assert_true(has_line(out, "omni_engine_num_requests_waiting"
                         "{stage=\"voicebox\"} 4"));
    assert_false(has_line(out, "omni_engine_stage_ready 1"));
    // one HELP per family, whatever the number of stages
    assert_null(strstr(strstr(out, "# HELP omni_engine_stage_ready ") + 1,
                       "# HELP omni_engine_stage_ready "));
    assert_true(has_line(out, "omni_engine_pool_blocks_total 512"));
    assert_true(has_line(out, "omni_engine_pool_blocks_used 3"));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_thinker_row),
        cmocka_unit_test(test_no_page),
        cmocka_unit_test(test_own_render),
        cmocka_unit_test(test_reset_thinker),
        cmocka_unit_test(test_stage_argv),
        cmocka_unit_test(test_three_stages),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("metrics", tests, NULL, NULL);
}
