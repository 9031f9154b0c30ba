-- replbox's ghci macros, compiled once by the server into a package that ghci loads as
-- object code (see docs/bootstrap-protocol.md, "Compiled bootstrap modules"). The
-- session's values come at run time, in a Session given by the bootstrap's `:def` lines;
-- nothing here is per session, so one build serves every session of this ghc.
-- Without a build (no ghc to compile it), bootstrap.ghci defines the same macros as
-- interpreted code: keep the two alike.
module ReplboxGhci (Session (..), mark, eval) where

import Control.Exception (SomeException, fromException, try, catch, AsyncException (UserInterrupt))
import Control.Monad (unless, when)
import Data.Char (isAlpha, isAlphaNum, isDigit, isLower, isPunctuation, isSpace, isSymbol, toUpper)
import Data.IORef (IORef, newIORef, readIORef, writeIORef)
import qualified GHC.IO.Handle as H
import System.Directory (doesFileExist)
import System.IO
import qualified System.Posix.IO as P
import qualified System.Posix.Terminal as T
import System.IO.Unsafe (unsafePerformIO)

-- | What the server tells one session: its control directory, its nonce, its prompts, and
-- the protocol's file names (with `{n}` for the evaluation's number).
data Session = Session
  { ctl :: String
  , nonce :: String
  , prompt :: String
  , continuation :: String
  , cellFile :: String
  , interruptFile :: String
  , inputFile :: String
  }

ignore :: SomeException -> IO ()
ignore _ = return ()

-- | A file name of the protocol, with the evaluation's number for `{n}`.
named :: String -> String -> String
named n pat = case pat of
  ('{' : 'n' : '}' : r) -> n ++ r
  (c : r) -> c : named n r
  [] -> []

inCtl :: Session -> String -> String
inCtl s f = ctl s ++ "/" ++ f

-- | `:rbxmark N`: flush, give ghci a readable stdin, discard typed input the cell left
-- unread, write the end marker, and put the session's prompts back.
mark :: Session -> String -> IO String
mark s arg = do
  let n = filter isDigit arg
      orZero :: SomeException -> IO Int
      orZero _ = return 0
      utf8len c = if fromEnum c < 0x80 then 1 else if fromEnum c < 0x800 then 2 else if fromEnum c < 0x10000 then 3 else 4 :: Int
      drain k = if k > 16777216 then return k else do
        r <- hReady stdin
        if r then getChar >>= \c -> drain (k + utf8len c) else return k
  hFlush stdout `catch` ignore
  hFlush stderr `catch` ignore
  -- A read to the end (getContents, interact; Ctrl-D ends it) leaves stdin semi-closed or
  -- closed, and ghci reads its next line from that same handle: give it a fresh one on the
  -- terminal. A lazy string still reading it ends there.
  readable <- hIsReadable stdin `catch` (\e -> const (return False) (e :: SomeException))
  unless readable ((do
      hClose stdin `catch` ignore
      fd <- openFile "/dev/tty" ReadMode >>= P.handleToFd
      when (fd /= 0) (P.dupTo fd 0 >> P.closeFd fd)
      fresh <- P.dup 0 >>= P.fdToHandle
      H.hDuplicateTo fresh stdin
      hClose fresh
      hSetBuffering stdin LineBuffering) `catch` ignore)
  -- Input typed into the cell (replbox says so with a file) that the program did not read
  -- would be ghci's next line: take it out of stdin's buffer and the terminal, and count it.
  typed <- doesFileExist (inCtl s (named n (inputFile s)))
  unread <- if not typed then return 0 else drain 0 `catch` orZero
  when typed (T.discardData 0 T.InputQueue `catch` ignore)
  let payload = if unread > 0 then b64 ("{\"unread\":" ++ show unread ++ "}") else ""
  putStr ("\ESC_rbx;" ++ nonce s ++ ";e;" ++ n ++ ";?;" ++ payload ++ "\ESC\\")
  hFlush stdout
  -- The prompts are replbox's between cells, whatever the cell set (`:set prompt "> "`).
  return (":set prompt " ++ show (prompt s) ++ "\n:set prompt-cont " ++ show (continuation s))

b64 :: String -> String
b64 s = case map fromEnum s of
  (a : b : c : _) -> quad a b c 4 ++ b64 (drop 3 s)
  [a, b] -> quad a b 0 3 ++ "="
  [a] -> quad a 0 0 2 ++ "=="
  _ -> ""
  where
    sixtyfour = ['A' .. 'Z'] ++ ['a' .. 'z'] ++ ['0' .. '9'] ++ "+/"
    quad a b c k = let v = a * 65536 + b * 256 + c in take k (map (\sh -> sixtyfour !! (v `div` sh `mod` 64)) [262144, 4096, 64, 1 :: Int])

-- | The chunks of the evaluation in flight that are still to be typed, split once when
-- `:rbxeval N` starts it, so each step costs its own chunk, not a new pass over the cell.
queue :: IORef (String, [String])
queue = unsafePerformIO (newIORef ("", []))
{-# NOINLINE queue #-}

-- | `:rbxeval N` reads the cell, splits it into chunks and returns the first followed by
-- `:rbxeval N 1`, which returns the second, and so on; the last is followed by
-- `:rbxmark N`. An interrupted evaluation (its file in ctl/) ends at the next step.
eval :: Session -> String -> IO String
eval s arg = do
  let (n, k) = case words arg of
        (a : b : _) -> (filter isDigit a, read ('0' : filter isDigit b) :: Int)
        (a : _) -> (filter isDigit a, 0)
        [] -> ("", 0)
  when (k == 0) (putStr ("\ESC_rbx;" ++ nonce s ++ ";s;" ++ n ++ "\ESC\\") >> hFlush stdout)
  stop <- doesFileExist (inCtl s (named n (interruptFile s)))
  queued <- readIORef queue
  r <- if stop then return (Right []) else case queued of
    (m, rest) | k > 0 && m == n -> writeIORef queue (n, drop 1 rest) >> return (Right (take 1 rest))
    _ -> try (do
         -- The cell is UTF-8 whatever the locale.
         h <- openFile (inCtl s (named n (cellFile s))) ReadMode
         hSetEncoding h utf8
         src <- hGetContents h
         let chunks = drop k (split n src)
         -- all of it now: the file is closed, and a failure is reported here
         sum (map length chunks) `seq` writeIORef queue (n, drop 1 chunks)
         return (take 1 chunks))
  case r of
    Left e -> do
      case fromException e of
        -- Interrupted before the cell's code ran: as ghci says it.
        Just UserInterrupt -> hPutStrLn stderr "Interrupted."
        -- In the form error_pattern knows, so the evaluation is an error.
        _ -> hPutStrLn stderr ("*** Exception: replbox cannot run the cell: " ++ show (e :: SomeException))
      return (":rbxmark " ++ n)
    Right [] -> return (":rbxmark " ++ n)
    Right (c : _) -> return (c ++ ":rbxeval " ++ n ++ " " ++ show (k + 1))

-- | The ghci input of each chunk of cell N: ghci commands and `:{ ... :}` blocks as they
-- are; a LANGUAGE or OPTIONS_GHC pragma line as `:set`; consecutive declarations together
-- in one block; every other item in its own block; each block with a LINE pragma.
split :: String -> String -> [String]
split n src =
  let ls = lines (filter (/= '\r') src)
      -- comments and blank lines alone are not worth a round trip
      -- (an unclosed {- is kept, for ghci to say so)
      items = filter (\(kd, _, xs) -> kd /= 'c' || not (null (lexH (unlines xs))) || foldl cdepth 0 xs > 0) (grp 0 0 False ls [])
      kinds = resolve (map (\(_, _, xs) -> classify (lexH (unlines xs))) items)
      code i xs = ":{\n{-# LINE " ++ show (i + 1) ++ " \"<cell " ++ n ++ ">\" #-}\n" ++ unlines xs ++ ":}\n"
      render :: [((Char, Int, [String]), Char)] -> [String]
      render its = case its of
        [] -> []
        (('m', _, xs), _) : rest -> unlines xs : render rest
        (('u', _, xs), _) : rest ->
          let closed = map (reverse . dropWhile isSpace . reverse) (take 1 (reverse xs)) == [":}"]
          in unlines (if closed then xs else xs ++ [":}"]) : render rest
        (('c', i, xs), 'd') : rest ->
          let (more, rest') = span (\((kd, _, _), c) -> kd == 'c' && c == 'd') rest
          in code i (xs ++ concatMap (\((_, _, ys), _) -> ys) more) : render rest'
        (('c', i, xs), _) : rest -> code i xs : render rest
        (_ : rest) -> render rest
  in render (zip items kinds)

isSym :: Char -> Bool
isSym c = c `elem` "!#$%&*+./<=>?@\\^|-~:" || ((isSymbol c || isPunctuation c) && c `notElem` "()[]{},;`'\"_")

isIdent :: Char -> Bool
isIdent c = isAlphaNum c || c == '_' || c == '\''

skipStr :: String -> String
skipStr s = case s of
  [] -> []
  ('\\' : _ : r) -> skipStr r
  ('"' : r) -> r
  ('\n' : r) -> r
  (_ : r) -> skipStr r

skipBlock :: Int -> String -> String
skipBlock d s = case s of
  [] -> []
  ('-' : '}' : r) -> if d <= 1 then r else skipBlock (d - 1) r
  ('{' : '-' : r) -> skipBlock (d + 1) r
  (_ : r) -> skipBlock d r

charLit :: String -> Maybe String
charLit s = case s of
  ('\\' : r) -> case break (== '\'') r of
    (_, '\'' : r') -> Just r'
    _ -> Nothing
  (_ : '\'' : r) -> Just r
  _ -> Nothing

lexH :: String -> [String]
lexH s = case s of
  [] -> []
  ('{' : '-' : r) -> lexH (skipBlock 1 r)
  ('"' : r) -> "\"\"" : lexH (skipStr r)
  ('\'' : r) -> case charLit r of
    Just r' -> "''" : lexH r'
    Nothing -> lexH r
  (c : r)
    | isSpace c -> lexH r
    | c `elem` "()[]{},;`" -> [c] : lexH r
    | isSym c ->
        let (op, r') = span isSym s
        in if length op >= 2 && all (== '-') op
             then lexH (dropWhile (/= '\n') r')
             else op : lexH r'
    | isAlpha c || c == '_' -> let (w, r') = span isIdent s in w : lexH r'
    | otherwise -> let (w, r') = span isIdent r in (c : w) : lexH r'

-- | Block-comment depth after a line (strings and line comments skipped).
cdepth :: Int -> String -> Int
cdepth d s = case s of
  [] -> d
  ('{' : '-' : r) -> cdepth (d + 1) r
  ('-' : '}' : r) | d > 0 -> cdepth (d - 1) r
  (_ : r) | d > 0 -> cdepth d r
  ('"' : r) -> cdepth d (skipStr r)
  (c : r)
    | isSym c ->
        let (op, r') = span isSym s
        in if length op >= 2 && all (== '-') op then d else cdepth d r'
    | otherwise -> cdepth d r

-- | A LANGUAGE or OPTIONS_GHC pragma line means a :set in ghci.
pragma :: String -> Maybe String
pragma l = case words (map (\c -> if c == ',' then ' ' else c) l) of
  ("{-#" : kw : rest@(_ : _)) | last rest == "#-}" ->
    case map toUpper kw of
      "LANGUAGE" -> Just (":set" ++ concatMap (" -X" ++) (init rest))
      "OPTIONS_GHC" -> Just (unwords (":set" : init rest))
      _ -> Nothing
  _ -> Nothing

-- | Items: (kind, first line number, lines); kinds: 'c' code, 'm' ghci command, 'u' user
-- `:{ :}` block. The lines of an item are kept reversed while it grows.
grp :: Int -> Int -> Bool -> [String] -> [(Char, Int, [String])] -> [(Char, Int, [String])]
grp _ _ _ [] acc = reverse (map (\(k, j, xs) -> (k, j, reverse xs)) acc)
grp i d inU (l : ls) acc =
  let d' = cdepth d l
      t = reverse (dropWhile isSpace (reverse l))
      add = case acc of
        ((k, j, xs) : rest) | k == 'c' -> (k, j, l : xs) : rest
        _ -> ('c', i, [l]) : acc
      new k = (k, i, [l]) : acc
  in if inU then
       case acc of
         ((k, j, xs) : rest) -> grp (i + 1) d (t /= ":}") ls ((k, j, l : xs) : rest)
         [] -> grp (i + 1) d False ls acc
     else if d > 0 then grp (i + 1) d' False ls add
     else if t == ":{" then grp (i + 1) d True ls (new 'u')
     else case l of
       [] -> grp (i + 1) d' False ls add
       (c : _) | isSpace c -> grp (i + 1) d' False ls add
       (':' : _) -> grp (i + 1) d' False ls (new 'm')
       _ | Just cmd <- pragma l -> grp (i + 1) d' False ls (('m', i, [cmd]) : acc)
       _ | null (lexH l) -> grp (i + 1) d' False ls add
       _ -> grp (i + 1) d' False ls (('c', i, [l]) : acc)

declKw, stopKw :: [String]
declKw = ["data", "newtype", "type", "class", "instance", "deriving", "infix", "infixl", "infixr", "foreign", "pattern", "default"]
stopKw = ["<-", "->", "let", "do", "case", "of", "if", "then", "else", "\\", "where", "in", "mdo", "proc"]

-- | 'd' declaration, 's' type signature, 'e' anything else (expression, statement, import).
classify :: [String] -> Char
classify ts = case ts of
  (t : _) | t `elem` declKw -> 'd'
  ("import" : _) -> 'e'
  _ -> go (0 :: Int) [] ts
  where
    go d pre (t : r)
      | t `elem` ["(", "[", "{"] = go (d + 1) (t : pre) r
      | t `elem` [")", "]", "}"] = go (max 0 (d - 1)) (t : pre) r
      | d == 0 && (t == "=" || t == "|") = 'd'
      | d == 0 && t == "::" = if all varish pre && not (null pre) then 's' else 'e'
      | d == 0 && t `elem` stopKw = 'e'
      | otherwise = go d (t : pre) r
    go _ _ [] = 'e'
    varish t = case t of
      (c : _) -> isLower c || c == '_' || t `elem` ["(", ")", ","] || isSym c
      [] -> False

-- | A signature is a declaration when a declaration follows it.
resolve :: [Char] -> [Char]
resolve ks = snd (foldr (\k (nxt, out) -> let k' = if k == 's' then (if nxt == 'd' then 'd' else 'e') else k in (k', k' : out)) ('e', []) ks)
