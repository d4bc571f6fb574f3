/* pbstr.c - see pbstr.h. */
#include "pbstr.h"

#include <string.h>

static int varint(const uint8_t *p, size_t len, size_t *i, uint64_t *v)
{
    *v = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        if (*i >= len)
            return -1;
        uint8_t b = p[(*i)++];
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return 0;
    }
    return -1;
}

int hd_pbstr_nul(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len, const char **field)
{
    size_t i = 0;
    while (i < len) {
        uint64_t key, v;
        if (varint(data, len, &i, &key))
            return 0;
        switch (key & 7) {
        case 0:
            if (varint(data, len, &i, &v))
                return 0;
            break;
        case 1:
            i += 8;
            break;
        case 5:
            i += 4;
            break;
        case 2: {
            if (varint(data, len, &i, &v) || v > len - i)
                return 0;
            const ProtobufCFieldDescriptor *fd =
                key >> 3 <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3)) : NULL;
            if (fd && fd->type == PROTOBUF_C_TYPE_STRING && memchr(data + i, 0, (size_t)v)) {
                *field = fd->name;
                return 1;
            }
            if (fd && fd->type == PROTOBUF_C_TYPE_MESSAGE && hd_pbstr_nul(fd->descriptor, data + i, (size_t)v, field))
                return 1;
            i += (size_t)v;
            break;
        }
        default:
            return 0;
        }
    }
    return 0;
}
