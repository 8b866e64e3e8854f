/* unicode.c - UTF-8 coding and category lookup over the generated range table. */
#include "unicode.h"

unsigned unicode_flags(uint32_t cp)
{
    if (cp < 256)
        return unicode_latin1[cp];
    if (cp > 0x10FFFF)
        return 0;
    /* The ranges cover U+0000..U+10FFFF without gaps: find the last one starting <= cp. */
    size_t lo = 0, hi = unicode_n_ranges;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (unicode_ranges[mid].lo <= cp)
            lo = mid;
        else
            hi = mid;
    }
    return unicode_ranges[lo].flags;
}
