/*
 * sibling.c - libmpu's side of comm/base/sibling.h: the one table of internals it
 * lends to the libraries and the tool built beside it.
 */
#include "comm/base/sibling.h"

#include "comm/base/reduce.h"
#include "comm/services.h"
#include "core/clock.h"
#include "core/env.h"
#include "core/options.h"

const mpu__sibling_table MPU_SIBLING_TABLE = {
    .trace = mpu__trace,
    .now = mpu__now,
    .take_options = mpu__take_options,
    .env_check_calls = mpu__env_check_calls,
    .env_timeout = mpu__env_timeout,
    .env_timeout_given = mpu__env_timeout_given,
    .env_mpi_p2p_check_ranks = mpu__env_mpi_p2p_check_ranks,
    .env_nccl_one_rank = mpu__env_nccl_one_rank,
    .module_register = mpu__module_register,
    .comm_new = mpu__comm_new,
    .comm_for_host = mpu__comm_for_host,
    .recv_mismatch = mpu__recv_mismatch,
    .deliver = mpu__deliver,
    .reduce = mpu__reduce,
    .coll_of = mpu__coll_of,
    .coll_fn = mpu__coll_fn,
    .sig_compare = mpu__sig_compare,
    .rendezvous_read_env = mpu__rendezvous_read_env,
    .rendezvous_join = mpu__rendezvous_join,
    .rendezvous_leave = mpu__rendezvous_leave,
    .rendezvous_post_abort = mpu__rendezvous_post_abort,
    .rendezvous_poll_abort = mpu__rendezvous_poll_abort,
    .rendezvous_check_abort = mpu__rendezvous_check_abort,
    .rendezvous_free = mpu__rendezvous_free,
    .rendezvous_child = mpu__rendezvous_child,
    .rendezvous_store = mpu__rendezvous_store,
    .rendezvous_serve_any = mpu__rendezvous_serve_any,
    .rendezvous_unserve = mpu__rendezvous_unserve,
    .rendezvous_attach = mpu__rendezvous_attach,
    .rendezvous_base = mpu__rendezvous_base,
    .store_connect = mpu__store_connect,
    .store_close = mpu__store_close,
    .store_wait = mpu__store_wait,
    .store_set = mpu__store_set,
    .store_get = mpu__store_get,
    .input_open = mpu__input_open,
    .output_check = mpu__output_check,
    .output_write = mpu__output_write,
    .jb_string_ex = mpu__jb_string_ex,
    .jb_free = mpu__jb_free,
};
