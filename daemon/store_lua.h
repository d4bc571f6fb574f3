/* store_lua.h - the Lua script of the Redis store (daemon/store_redis.c
 * includes it, and only it). Written for heapd; runs in Redis 4.0 or later
 * (EVAL/EVALSHA; the bit library of Redis's Lua 5.1). */
#ifndef HEAPD_STORE_LUA_H
#define HEAPD_STORE_LUA_H

/* ---- the Lua script -------------------------------------------------------
 * KEYS[1] state hash, KEYS[2] bitmap of the ranks seen.
 * ARGV[1] op: 'c' contribute, 't' this node timed out, 'a' abort, 'p'
 * publish; ARGV[2] node, ARGV[3] ttl (s), ARGV[4] key prefix (names the
 * collect in messages), then per op:
 *   c: 5 world size, 6 "collect N of heap \"H\"", 7 ranks (big-endian u32),
 *      8 candidates (big-endian u64, ascending: byte order is numeric order),
 *      9 "" (inline: 8 holds them all) or the byte length of the candidates
 *      the node staged in the hash PREFIX:u:NODE (fields "0", "1", ... of
 *      32768 bytes, HD_STORE_PIECE_BYTES, the last one shorter; HSET before
 *      this call; issue 33 item 5)
 *   t: 5 world size, 6 "collect N of heap \"H\" timed out after T ms"
 *   a: 5 message ("E<n>:" text, n = -HD_STORE_E*: every stored failure has one)
 *   p: 5 a message, published to heapd:node:NAME of every node in the hash
 *      but this one (the node signs it: issue 33 item 1; the script itself
 *      publishes nothing, so no message on a node channel comes from Redis)
 * Replies: {'ok', result} this call completed the collect; {'ok', inline,
 *   has_inline, staged} it completed it and nodes staged big sets: this node
 *   intersects inline (when has_inline == '1') with every staged set
 *   ("NODE LEN NODE LEN ...") and distributes the result; {'wait'};
 *   {'abort', message[, 'n']} the collect failed ('n': this call recorded
 *   it, so this node tells the others); {'done'} it had completed before this
 *   call; {'aborted', message} op 'a' recorded it; {'sent', n} op 'p'.
 * Work per call is bounded by the piece size, not by the block count: an
 * inline set is at most HD_STORE_PIECE offsets, so the running inline
 * intersection is too; staged sets are only counted (HLEN, HSTRLEN) here.
 * Hash fields: w world, cov ranks covered, nodes (space-separated, arrival
 * order), set running intersection of the inline sets, big the staged sets
 * ("NODE LEN ..."), abort, done, r:NODE the ranks NODE contributed
 * (big-endian u32; deleted at completion): a rank another node already
 * claimed fails the collect naming both nodes. */
static const char COLLECT_LUA[] =
    "local st, rk = KEYS[1], KEYS[2]\n"
    "local op, node, ttl, prefix = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]\n"
    "if op == 'p' then\n"
    "  local nodes, k = redis.call('HGET', st, 'nodes'), 0\n"
    "  for n in string.gmatch(nodes or '', '%S+') do\n"
    "    if n ~= node then redis.call('PUBLISH', 'heapd:node:' .. n, ARGV[5]); k = k + 1 end\n"
    "  end\n"
    "  return {'sent', k}\n"
    "end\n"
    "local function fail(msg)\n"
    "  local big = redis.call('HGET', st, 'big') or ''\n"
    "  for n in string.gmatch(big, '(%S+) %S+') do redis.call('DEL', prefix .. ':u:' .. n) end\n"
    "  redis.call('DEL', rk)\n"
    "  redis.call('HDEL', st, 'set', 'big')\n"
    "  redis.call('HSET', st, 'abort', msg)\n"
    "  redis.call('EXPIRE', st, ttl)\n"
    "end\n"
    "local function intersect(a, b)\n"
    "  if #a == 0 or #b == 0 then return '' end\n"
    "  if #a > #b then a, b = b, a end\n"
    "  local sub, seen = string.sub, {}\n"
    "  for i = 1, #a, 8 do seen[sub(a, i, i + 7)] = true end\n"
    "  local out, k = {}, 0\n"
    "  for i = 1, #b, 8 do\n"
    "    local r = sub(b, i, i + 7)\n"
    "    if seen[r] then k = k + 1; out[k] = r end\n"
    "  end\n"
    "  return table.concat(out)\n"
    "end\n"
    "local h = redis.call('HMGET', st, 'abort', 'done', 'w', 'cov', 'set', 'nodes', 'big')\n"
    "if h[1] then return {'abort', h[1]} end\n"
    "if h[2] then return {'done'} end\n"
    "if op == 'a' then\n"
    "  fail(ARGV[5])\n"
    "  return {'aborted', ARGV[5]}\n"
    "end\n"
    "local world = tonumber(ARGV[5])\n"
    "if op == 't' then\n"
    "  if h[3] then world = tonumber(h[3]) end\n"
    "  local bm = redis.call('GET', rk) or ''\n"
    "  local miss, n = {}, 0\n"
    "  local byte, band, shr = string.byte, bit.band, bit.rshift\n"
    "  for i = 0, math.floor((world - 1) / 8) do\n"
    "    local b = byte(bm, i + 1) or 0\n"
    "    if b ~= 255 then\n"
    "      for j = 0, 7 do\n"
    "        local r = i * 8 + j\n"
    "        if r < world and band(b, shr(128, j)) == 0 then\n"
    "          n = n + 1\n"
    "          if n <= 32 then miss[n] = tostring(r) end\n"
    "        end\n"
    "      end\n"
    "    end\n"
    "  end\n"
    "  local list = table.concat(miss, ', ')\n"
    "  if n == 0 then list = 'none' end\n"
    "  if n > 32 then list = list .. ' and ' .. (n - 32) .. ' more' end\n"
    "  local seen = 'none'\n"
    "  if h[6] then seen = string.gsub(h[6], ' ', ', ') end\n"
    "  local msg = 'E2:' .. ARGV[6] .. ': rank(s) ' .. list .. ' never arrived (nodes seen: ' .. seen .. ')'\n"
    "  fail(msg)\n"
    "  return {'abort', msg, 'n'}\n"
    "end\n"
    "if h[3] and tonumber(h[3]) ~= world then\n"
    "  local msg = 'E1:' .. ARGV[6] .. ': node ' .. node .. ' says the heap has ' .. world ..\n"
    "    ' ranks but node(s) ' .. (h[6] or '?') .. ' said ' .. h[3] ..\n"
    "    '; every node must give the same world size (check the job\\'s rank count on each node)'\n"
    "  fail(msg)\n"
    "  return {'abort', msg, 'n'}\n"
    "end\n"
    "local function claimer(want)\n"
    "  if not h[6] then return nil end\n"
    "  for n in string.gmatch(h[6], '%S+') do\n"
    "    local rl = redis.call('HGET', st, 'r:' .. n) or ''\n"
    "    for j = 1, #rl, 4 do\n"
    "      if string.sub(rl, j, j + 3) == want then return n end\n"
    "    end\n"
    "  end\n"
    "end\n"
    "local ranks, cov = ARGV[7], tonumber(h[4] or '0')\n"
    "for i = 1, #ranks, 4 do\n"
    "  local a, b, c, d = string.byte(ranks, i, i + 3)\n"
    "  local r = ((a * 256 + b) * 256 + c) * 256 + d\n"
    "  if redis.call('SETBIT', rk, r, 1) == 0 then cov = cov + 1\n"
    "  else\n"
    "    local other = claimer(string.sub(ranks, i, i + 3))\n"
    "    if other and other ~= node then\n"
    "      local msg = 'E1:' .. ARGV[6] .. ': rank ' .. r .. ' is claimed by node ' .. other ..\n"
    "        ' and by node ' .. node .. '; each rank attaches to the heapd of exactly one node (check the ' ..\n"
    "        'ranks each node starts and local_size)'\n"
    "      fail(msg)\n"
    "      return {'abort', msg, 'n'}\n"
    "    end\n"
    "  end\n"
    "end\n"
    "local set, big, staged = h[5], h[7], tonumber(ARGV[9] or '')\n"
    "if staged then\n"
    "  local uk, piece = prefix .. ':u:' .. node, 32768\n"
    "  local np = math.ceil(staged / piece)\n"
    "  local have = redis.call('HLEN', uk)\n"
    "  if have ~= np or redis.call('HSTRLEN', uk, tostring(np - 1)) ~= staged - (np - 1) * piece then\n"
    "    local msg = 'E1:' .. ARGV[6] .. ': node ' .. node .. ' staged ' .. have ..\n"
    "      ' pieces of candidates in Redis, not ' .. np ..\n"
    "      ' (its pieces were lost: keys evicted, or another program writing heapd keys?)'\n"
    "    fail(msg)\n"
    "    return {'abort', msg, 'n'}\n"
    "  end\n"
    "  big = (big and big .. ' ' or '') .. node .. ' ' .. staged\n"
    "elseif set then set = intersect(set, ARGV[8])\n"
    "else set = ARGV[8] end\n"
    "local nodes = h[6]\n"
    "if not nodes then nodes = node\n"
    "elseif not string.find(' ' .. nodes .. ' ', ' ' .. node .. ' ', 1, true) then nodes = nodes .. ' ' .. node end\n"
    "if cov >= world then\n"
    "  for n in string.gmatch(h[6] or '', '%S+') do redis.call('HDEL', st, 'r:' .. n) end\n"
    "  redis.call('HSET', st, 'nodes', nodes, 'w', world, 'cov', cov, 'done', '1')\n"
    "  redis.call('DEL', rk)\n"
    "  redis.call('HDEL', st, 'set', 'big')\n"
    "  redis.call('EXPIRE', st, ttl)\n"
    "  if big then return {'ok', set or '', set and '1' or '0', big} end\n"
    "  return {'ok', set}\n"
    "end\n"
    "redis.call('HSET', st, 'nodes', nodes, 'w', world, 'cov', cov, 'r:' .. node, ranks)\n"
    "if set then redis.call('HSET', st, 'set', set) end\n"
    "if big then redis.call('HSET', st, 'big', big) end\n"
    "redis.call('EXPIRE', st, ttl)\n"
    "redis.call('EXPIRE', rk, ttl)\n"
    "return {'wait'}\n";

#endif
