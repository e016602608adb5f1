/* hpd-prefill: the prefill role (prefill_node/prefill.h) on the node runtime. */
#include "node/node.h"
#include "prefill_node/prefill.h"

int main(int argc, char **argv)
{
    return hpd_node_main(argc, argv, &hpd_prefill_role);
}
