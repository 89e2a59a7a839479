
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_omni_engine_module.h -- what the three files of the omni_engine
 * CORE module share: its configuration (which is also the cache manager
 * process's state) and the functions one file calls in another.
 *
 *   ngx_omni_engine_module.c   directives, configuration, init_module and
 *                              exit_master: what nginx's master does
 *   ngx_omni_engine_manager.c  the cache manager's callback: starts,
 *                              watches and replaces engines
 *   ngx_omni_engine_proc.c     one engine process: its lock, its recorded
 *                              command line, its log, spawn and exec
 *
 * The design is told at the top of ngx_omni_engine_module.c.
 */


#ifndef _NGX_OMNI_ENGINE_MODULE_H_INCLUDED_
#define _NGX_OMNI_ENGINE_MODULE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>


#define NGX_OMNI_ENGINE_KILL_WAIT    10000    /* ms from SIGTERM to SIGKILL
                                                 for a new engine given up */
#define NGX_OMNI_ENGINE_EXIT_WAIT    5000     /* ms when nginx exits */
#define NGX_OMNI_ENGINE_FAST_FAIL    10000    /* died this soon: back off */
#define NGX_OMNI_ENGINE_MAX_BACKOFF  60000
#define NGX_OMNI_ENGINE_LOG_TAIL     2048     /* bytes of engine.log read
                                                 for its last line */


typedef struct {
    ngx_array_t      *args;         /* of ngx_str_t, the directive's */
    ngx_str_t         state_dir;
    ngx_msec_t        interval;
    ngx_msec_t        start_timeout;

    char            **argv;         /* args, "--lock-file", lock_file,
                                       "--replace", NULL; argv[0] is a
                                       full path */
    ngx_str_t         cmdline;      /* argv, each followed by NUL: the
                                       contents of engine.cmd and the
                                       /proc/PID/cmdline of an engine
                                       started from this configuration */
    u_char           *prefix;       /* the engine's working directory */
    u_char           *lock_file;    /* NUL-terminated, as the five below */
    u_char           *lock_next;    /* a new engine's lock until it takes
                                       over: lock_file + ".next" */
    u_char           *log_file;
    u_char           *cmd_file;
    u_char           *cmd_temp;

    /* the cache manager process's own state */
    ngx_pid_t         live;         /* the engine found at the last check */
    ngx_pid_t         spawned;      /* started (or adopted), not live yet */
    ngx_pid_t         replacing;    /* the live engine it is to replace,
                                       0 for a plain start */
    ngx_pid_t         stopping;     /* given up on, sent SIGTERM (SIGUSR2
                                       while a candidate) */
    ngx_uint_t        stopping_candidate;
    ngx_msec_t        started;      /* when "spawned" started */
    ngx_msec_t        stop_at;      /* SIGKILL for "stopping" then */
    ngx_msec_t        retry_at;     /* no plain start before */
    ngx_msec_t        backoff;
    off_t             log_size;     /* engine.log's size at the start */
    ngx_uint_t        failed;       /* a replacement by this command line
                                       failed: wait for the next reload */
    ngx_uint_t        unreadable;   /* engine.cmd could not be read (said
                                       once) */
} ngx_omni_engine_conf_t;


extern ngx_module_t  ngx_omni_engine_module;


/* ngx_omni_engine_manager.c: the state directory's manager callback */
ngx_msec_t ngx_omni_engine_manager(void *data);

/* ngx_omni_engine_proc.c */
void ngx_omni_engine_private(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf);
ngx_pid_t ngx_omni_engine_holder(u_char *lock_file);
ngx_uint_t ngx_omni_engine_locked(ngx_omni_engine_conf_t *oecf,
    ngx_pid_t pid);
ngx_uint_t ngx_omni_engine_alive(ngx_pid_t pid);
ngx_uint_t ngx_omni_engine_recorded(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf);
ngx_uint_t ngx_omni_engine_runs(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf, ngx_pid_t pid);
void ngx_omni_engine_record(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf);
void ngx_omni_engine_last_line(ngx_omni_engine_conf_t *oecf,
    u_char *buf, size_t size, ngx_str_t *line);
ngx_pid_t ngx_omni_engine_spawn(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf);


#endif /* _NGX_OMNI_ENGINE_MODULE_H_INCLUDED_ */
