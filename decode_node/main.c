/* hpd-decode: the decode role (decode_node/decode.h) on the node runtime. */
#include "node/node.h"
#include "decode_node/decode.h"

int main(int argc, char **argv)
{
    return hpd_node_main(argc, argv, &hpd_decode_role);
}
