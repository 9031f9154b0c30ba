# replbox's bootstrap for irb (see docs/bootstrap-protocol.md). Before writing it into the
# session's control directory, replbox replaces the placeholders below, marked `:ruby`, by
# Ruby string literals (in which nothing interpolates).
nc, dir, cell_file, input_file = {nonce:ruby}, {ctl:ruby}, {cell_file:ruby}, {input_file:ruby}
boot = File.expand_path(__FILE__)
marker, cont = {prompt:ruby}, {continuation:ruby}
require "io/console"
IRB.conf[:PROMPT][:RBX] = { PROMPT_I: marker, PROMPT_N: cont, PROMPT_S: cont, PROMPT_C: cont, RETURN: "=> %s\n" }
IRB.conf[:PROMPT_MODE] = :RBX
IRB.conf[:ECHO] = false
IRB.conf[:SAVE_HISTORY] = nil
IRB.conf[:USE_COLORIZE] = false
IRB.conf[:AUTO_INDENT] = false

json_str = lambda do |s|
  s = s.to_s.dup.force_encoding(Encoding::UTF_8).scrub("?")
  '"' + s.gsub(/[\\"\u0000-\u001f\u007f]/) { |c| format("\\u%04x", c.ord) } + '"'
end
# Markers go to a descriptor of their own on the terminal, so code that closes or reopens
# STDOUT cannot swallow them.
tty = STDOUT.stat.rdev
mark = [STDOUT.dup]
tell = lambda do |text|
  begin
    st = mark[0].stat
    raise IOError unless st.chardev? && st.rdev == tty
  rescue StandardError
    mark[0] = (File.open("/dev/tty", "w") rescue nil)
  end
  mark[0]&.syswrite(text) rescue nil
end
# What the end marker carries besides an error (session_vars' list), as JSON text.
extra = {}
emit = lambda do |n, status, err, unread|
  fields = extra.map { |k, v| "#{json_str.(k)}:#{v}" }
  fields.unshift("\"type\":#{json_str.(err[0])},\"message\":#{json_str.(err[1])}") if err
  fields << "\"unread\":#{unread}" if unread > 0
  payload = fields.empty? ? "" : ["{#{fields.join(",")}}"].pack("m0")
  extra.clear
  [$stdout, $stderr, STDOUT, STDERR].each { |s| s.flush rescue nil }
  tell.("\e_rbx;#{nc};e;#{n};#{status};#{payload}\e\\")
end
# Input typed into the cell (replbox says so with a file) that the program did not read would
# be irb's next line: read it out of STDIN's buffer and the terminal, with the line discipline
# briefly out of line mode (a line without Enter comes too), and count it.
discard_unread = lambda do |n|
  next 0 unless File.exist?(File.join(dir, input_file.sub("{n}", n.to_s)))
  count = 0
  begin
    STDIN.raw(min: 0, time: 0, intr: true) do
      count += STDIN.readpartial(65536).bytesize while count < (1 << 24)
    end
  rescue EOFError, IOError, SystemCallError
    nil
  end
  STDIN.iflush rescue nil
  count
end
# The prompts are ours between cells (replbox recognises them) and the user's while a cell
# runs: `conf.prompt_mode = :SIMPLE` is kept for the cell that reads it, never printed.
prompts = %i[@prompt_mode @prompt_i @prompt_s @prompt_c @prompt_n]
user_prompts = nil
to_user = lambda do |ctx|
  if user_prompts
    prompts.zip(user_prompts) { |iv, v| ctx.instance_variable_set(iv, v) }
  else
    ctx.prompt_mode = :DEFAULT
  end
end
to_ours = lambda do |ctx|
  user_prompts = prompts.map { |iv| ctx.instance_variable_get(iv) }
  ctx.instance_variable_set(:@prompt_i, marker)
  %i[@prompt_s @prompt_c @prompt_n].each { |iv| ctx.instance_variable_set(iv, cont) }
end
# Rubygems' `require` takes any exception raised in its own code (finding the file, its
# lock) for a lock left held: it dumps its state, raises, and may keep the lock. An
# interrupt that comes there is held until that `require` returns (a file it loads is the
# code's own and is interrupted at once). The interrupt carries the code's frames, not ours.
gems_req = Kernel.instance_method(:require)
gems_file = gems_req.source_location&.first
gems_dir = gems_file && File.dirname(gems_file.delete_prefix("<internal:").delete_suffix(">"), 2)
gems_depth = lambda do |locs|
  locs.count { |l| l.path == gems_file && l.label == "require" }
end
# How many of rubygems' `require` frames are on the stack when `locs` are inside one's own
# code (nothing but rubygems and ruby's internals above it), else nil.
in_gems = lambda do |locs|
  locs.each do |l|
    path = l.path.to_s
    return gems_depth.(locs) if path == gems_file && l.label == "require"
    return nil unless path.start_with?("<internal:") || path.start_with?(gems_dir)
  end
  nil
end
held = []
held_bt = []
deliver = TracePoint.new(:return) do |tp|
  d = held[0]
  next unless d && Thread.current.equal?(Thread.main) && gems_depth.(caller_locations) <= d
  held.clear
  tp.disable
  Thread.main.raise(Interrupt, "Interrupt", held_bt[0] || [])
end
unheld = lambda do
  held.clear
  deliver.disable if deliver.enabled?
end
# Ctrl-C raises Interrupt in the cell, as in a Ruby program (irb's own handler raises
# IRB::Abort, which `rescue Interrupt` does not catch); a trap the code sets is kept.
# The interrupt goes through the main thread's queue of asynchronous exceptions (ruby's
# default handler raises at once, wherever the thread is), so that __rbx_eval can keep it
# out of its own code. Between cells an interrupt comes too late for any cell and does
# nothing (irb's handler would drop the line it is reading: the next cell's).
irb_int = nil
quiet = proc {}
# A second Ctrl-C that comes while the first is being taken adds nothing.
taking = []
to_code = proc do
  next if taking[0]
  taking[0] = true
  begin
    d = gems_dir && in_gems.(caller_locations)
    if d
      held[0] = d
      held_bt[0] = caller
      deliver.enable(target: gems_req) unless deliver.enabled?
    else
      Thread.main.raise(Interrupt, "Interrupt", caller)
    end
  ensure
    taking.clear
  end
end
int_to_user = lambda do
  prev = trap("INT", to_code)
  irb_int ||= prev
  trap("INT", prev) unless prev.equal?(irb_int) || prev.equal?(quiet)
end
int_to_irb = lambda do
  now = trap("INT", quiet)
  trap("INT", now) unless now.equal?(to_code)
end
# Print an exception as ruby does, without the frames of this bootstrap and irb.
report = lambda do |e|
  bt = e.backtrace || []
  cut = bt.index { |l| l.start_with?(boot) }
  bt = bt[0...cut] if cut
  # A cell's own code is evaluated in irb's binding, which ruby names `<top (required)>`
  # (irb was required); irb itself says `<main>` there.
  bt = bt.map { |l| l.sub(/\A(<cell \d+>:\d+:in [`'](?:block (?:\(\d+ levels\) )?in )?)<top \(required\)>'/, "\\1<main>'") }
  if bt.empty?
    first, *rest = e.message.to_s.lines
    $stderr.print("#{first.to_s.chomp} (#{e.class})\n", *rest)
  else
    e.set_backtrace(bt) rescue nil
    $stderr.print(e.full_message(highlight: false, order: :top))
  end
end
# Show a value the way irb shows the value of a typed line.
show = lambda do |ctx, src, value|
  next if value.nil?
  irb = ctx.irb
  ctx.set_last_value(value)
  if irb.respond_to?(:assignment_expression?) && irb.assignment_expression?(src)
    mode = ctx.echo_on_assignment
    irb.output_value(mode == :truncate) if mode
  elsif irb.respond_to?(:output_value)
    irb.output_value
  else
    puts "=> #{value.inspect}"
  end
end
# Interrupts (Ctrl-C raises Interrupt, irb's handler raises IRB::Abort, both through the
# main thread's queue of asynchronous exceptions) reach the user's code only: around it,
# this method runs with them deferred, and one that comes once the code is over is dropped
# (too late for it) before the end marker.
late = lambda do
  while Thread.pending_interrupt?(Interrupt) || Thread.pending_interrupt?(IRB::Abort)
    begin
      Thread.handle_interrupt(Interrupt => :immediate, IRB::Abort => :immediate) { nil }
    rescue Interrupt, IRB::Abort
      nil
    end
  end
end
Object.send(:define_method, :__rbx_eval) do |n|
  Thread.handle_interrupt(Interrupt => :never, IRB::Abort => :never) do
    ctx = IRB.CurrentContext
    unheld.()
    to_user.(ctx)
    int_to_user.()
    tell.("\e_rbx;#{nc};s;#{n}\e\\")
    status, err, value, exiting = "ok", nil, nil, false
    owner = Process.pid
    begin
      src = File.read(File.join(dir, cell_file.sub("{n}", n.to_s)), encoding: "UTF-8")
      done = false
      Thread.handle_interrupt(Interrupt => :immediate, IRB::Abort => :immediate) do
        # One that came before the code is taken here, where it stops the code as it begins,
        # not at the code's first check for interrupts (which may be in rubygems' `require`).
        Thread.pass
        # irb's `exit` throws :IRB_EXIT, and irb then exits 0 whatever the argument.
        code = catch(:IRB_EXIT) do
          value = eval(src, ctx.workspace.binding, "<cell #{n}>", 1)
          done = true
        end
        unless done
          exiting = true
          Kernel.exit([true, false].include?(code) || code.is_a?(Integer) ? code : 0)
        end
        show.(ctx, src, value) if Process.pid == owner
      end
    rescue SystemExit
      exiting = true
      raise
    rescue IRB::Abort, Interrupt
      status, err = "interrupted", ["Interrupt", ""]
      $stderr.puts "Interrupt"
    rescue Exception => e
      status, err = "error", [e.class.name || e.class.inspect, e.message.to_s[0, 2000]]
      report.(e)
    ensure
      if Process.pid != owner && !exiting
        # A process the cell forked (a bare `fork`) ends with the cell: only irb's own
        # process goes back to reading the terminal and reports the end.
        [$stdout, $stderr].each { |s| s.flush rescue nil }
        exit!(status == "ok" ? 0 : 1)
      end
      int_to_irb.()
      unheld.()
      to_ours.(ctx)
      late.()
      emit.(n, status, err, discard_unread.(n)) unless exiting
      late.()
    end
    value
  end
end
Object.send(:private, :__rbx_eval)
# session_vars: irb's local variables and main's instance variables, each with its class, a
# short summary and its size where objspace tells, in the end marker's payload.
Object.send(:define_method, :__rbx_vars) do
  ws = IRB.CurrentContext.workspace
  found = []
  used = 2
  omitted = 0
  entry = lambda do |name, v|
    summary = begin
      s = v.respond_to?(:size) && (v.is_a?(Array) || v.is_a?(Hash) || v.is_a?(String)) ? "size #{v.size}: " : ""
      s + (v.is_a?(Array) || v.is_a?(Hash) ? (v.size > 20 ? v.first(5).inspect : v.inspect) : v.inspect)
    rescue Exception
      "(no summary)"
    end
    size = begin
      require "objspace"
      ObjectSpace.memsize_of(v)
    rescue Exception
      nil
    end
    cls = (v.class.name rescue nil) || "?"
    e = "{\"name\":#{json_str.(name)},\"type\":#{json_str.(cls)},\"summary\":#{json_str.(summary.to_s[0, 200])}"
    e += ",\"size\":#{size.to_i}" if size && size > 0
    e + "}"
  end
  names = ws.binding.local_variables.reject { |v| v.to_s.start_with?("_") }.map { |v| [v.to_s, ws.binding.local_variable_get(v)] }
  names += ws.main.instance_variables.map { |v| [v.to_s, ws.main.instance_variable_get(v)] }
  names.first(2000).each do |name, v|
    e = entry.(name, v)
    if used + e.bytesize + 1 > 11000
      omitted += 1
      next
    end
    used += e.bytesize + 1
    found << e
  end
  extra["vars"] = "[#{found.join(",")}]"
  extra["vars_omitted"] = omitted.to_s if omitted > 0
  nil
end
Object.send(:private, :__rbx_vars)
