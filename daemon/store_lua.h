/* store_lua.h - the Lua script of the Redis store (daemon/store_redis.c
 * includes it, and only it). Written for heapd; runs in Redis 4.0 or later
 * (EVAL/EVALSHA; the bit library of Redis's Lua 5.1). */
#ifndef HEAPD_STORE_LUA_H
#define HEAPD_STORE_LUA_H

/* ---- the Lua script -------------------------------------------------------
 * KEYS[1] state hash, KEYS[2] bitmap of the ranks seen.
 * ARGV[1] op: 'c' contribute, 't' this node timed out, 'a' abort;
 * ARGV[2] node, ARGV[3] ttl (s), ARGV[4] key prefix (names the collect in
 * messages), then per op:
 *   c: 5 world size, 6 "collect N of heap \"H\"", 7 ranks (big-endian u32),
 *      8 candidates (big-endian u64, ascending: byte order is numeric order)
 *   t: 5 world size, 6 "collect N of heap \"H\" timed out after T ms"
 *   a: 5 message ("E<n>:" text, n = -HD_STORE_E*: every stored failure has one)
 * Replies: {'ok', result} this call completed the collect; {'wait'};
 *   {'abort', message} the collect failed (now or before); {'done'} it had
 *   completed before this call; {'aborted', message} op 'a' recorded it.
 * Messages to heapd:node:NAME: 'R' prefix '\n' result, 'A' prefix '\n' text.
 * Hash fields: w world, cov ranks covered, nodes (space-separated, arrival
 * order), set running intersection, abort, done. */
static const char COLLECT_LUA[] =
    "local st, rk = KEYS[1], KEYS[2]\n"
    "local op, node, ttl, prefix = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]\n"
    "local function notify(kind, body)\n"
    "  local nodes = redis.call('HGET', st, 'nodes')\n"
    "  if not nodes then return end\n"
    "  local msg = kind .. prefix .. '\\n' .. body\n"
    "  for n in string.gmatch(nodes, '%S+') do\n"
    "    if n ~= node then redis.call('PUBLISH', 'heapd:node:' .. n, msg) end\n"
    "  end\n"
    "end\n"
    "local function fail(msg)\n"
    "  redis.call('DEL', rk)\n"
    "  redis.call('HDEL', st, 'set')\n"
    "  redis.call('HSET', st, 'abort', msg)\n"
    "  redis.call('EXPIRE', st, ttl)\n"
    "  notify('A', msg)\n"
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
    "local h = redis.call('HMGET', st, 'abort', 'done', 'w', 'cov', 'set', 'nodes')\n"
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
    "  return {'abort', msg}\n"
    "end\n"
    "if h[3] and tonumber(h[3]) ~= world then\n"
    "  local msg = 'E1:' .. ARGV[6] .. ': node ' .. node .. ' says the heap has ' .. world ..\n"
    "    ' ranks but node(s) ' .. (h[6] or '?') .. ' said ' .. h[3] ..\n"
    "    '; every node must give the same world size (check the job\\'s rank count on each node)'\n"
    "  fail(msg)\n"
    "  return {'abort', msg}\n"
    "end\n"
    "local ranks, cov = ARGV[7], tonumber(h[4] or '0')\n"
    "for i = 1, #ranks, 4 do\n"
    "  local a, b, c, d = string.byte(ranks, i, i + 3)\n"
    "  if redis.call('SETBIT', rk, ((a * 256 + b) * 256 + c) * 256 + d, 1) == 0 then cov = cov + 1 end\n"
    "end\n"
    "local set = ARGV[8]\n"
    "if h[5] then set = intersect(h[5], set) end\n"
    "local nodes = h[6]\n"
    "if not nodes then nodes = node\n"
    "elseif not string.find(' ' .. nodes .. ' ', ' ' .. node .. ' ', 1, true) then nodes = nodes .. ' ' .. node end\n"
    "if cov >= world then\n"
    "  redis.call('HSET', st, 'nodes', nodes, 'w', world, 'cov', cov, 'done', '1')\n"
    "  notify('R', set)\n"
    "  redis.call('DEL', rk)\n"
    "  redis.call('HDEL', st, 'set')\n"
    "  redis.call('EXPIRE', st, ttl)\n"
    "  return {'ok', set}\n"
    "end\n"
    "redis.call('HSET', st, 'nodes', nodes, 'w', world, 'cov', cov, 'set', set)\n"
    "redis.call('EXPIRE', st, ttl)\n"
    "redis.call('EXPIRE', rk, ttl)\n"
    "return {'wait'}\n";

#endif
